//! `NativeSession`: one conversation and its KV cache on the engine thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use super::error::{disposed, to_napi};
use super::runtime::NativeRuntime;
use super::stream::TokenStream;
use super::types::{JsChatMessage, NativeGenerateOptions, NativeInput};
use crate::engine::{Engine, ExpertChoice, SessionHandle};

#[napi]
pub struct NativeSession {
    engine: Arc<Engine>,
    handle: SessionHandle,
    disposed: AtomicBool,
}

impl NativeSession {
    pub fn new(engine: Arc<Engine>, handle: SessionHandle) -> Self {
        Self { engine, handle, disposed: AtomicBool::new(false) }
    }

    fn check(&self) -> Result<()> {
        if self.disposed.load(Ordering::Acquire) {
            return Err(disposed("session"));
        }
        if self.engine.is_disposed() {
            return Err(disposed("runtime"));
        }
        Ok(())
    }
}

#[napi]
impl NativeSession {
    /// Queues a request and returns its token stream. Throws `SESSION_BUSY` synchronously
    /// when this session is already generating.
    /// `draft`: the runtime whose model proposes drafts (`speculative: { type: 'draft' }`).
    #[napi]
    pub fn generate(
        &self,
        input: NativeInput,
        options: Option<NativeGenerateOptions>,
        draft: Option<&NativeRuntime>,
    ) -> Result<TokenStream> {
        self.check()?;
        let input = input.into_engine()?;
        let draft = draft.map(NativeRuntime::draft_model).transpose()?;
        let options = options.unwrap_or_default().into_engine(draft)?;
        let g = self.engine.generate(&self.handle, input, options).map_err(to_napi)?;
        Ok(TokenStream::new(g))
    }

    #[napi(getter)]
    pub fn history(&self) -> Vec<JsChatMessage> {
        self.handle.shared.history.lock().unwrap().iter().cloned().map(Into::into).collect()
    }

    #[napi(getter)]
    pub fn busy(&self) -> bool {
        self.handle.shared.busy.load(Ordering::Acquire)
    }

    /// The session's default expert names (empty when it routes automatically).
    #[napi(getter)]
    pub fn experts(&self) -> Vec<String> {
        match &*self.handle.shared.experts.lock().unwrap() {
            ExpertChoice::Named(names) => names.clone(),
            ExpertChoice::Auto => Vec::new(),
        }
    }

    /// Whether the session routes each request (`experts: 'auto'`).
    #[napi(getter)]
    pub fn experts_auto(&self) -> bool {
        *self.handle.shared.experts.lock().unwrap() == ExpertChoice::Auto
    }

    /// Replaces the default expert set (`auto`: routed per request); `SESSION_BUSY` while
    /// generating, `EXPERT_NOT_FOUND` for a name not loaded.
    #[napi]
    pub fn set_experts(&self, names: Vec<String>, auto: Option<bool>) -> Result<()> {
        self.check()?;
        let choice = if auto == Some(true) { ExpertChoice::Auto } else { ExpertChoice::Named(names) };
        self.engine.set_session_experts(&self.handle, choice).map_err(to_napi)
    }

    /// Replaces the history without generating (`SESSION_BUSY` while generating).
    #[napi]
    pub fn set_history(&self, messages: Vec<JsChatMessage>) -> Result<()> {
        self.check()?;
        let messages = messages.into_iter().map(Into::into).collect();
        self.engine.set_history(&self.handle, messages).map_err(to_napi)
    }

    /// Writes the session (history, cache, recurrent state) to `path`, atomically; off the JS
    /// thread. `SESSION_BUSY` while generating: checked here, on the JS thread, so a save
    /// called while a request runs is refused even when the request ends before the promise
    /// is polled.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn save<'env>(&self, env: &'env Env, path: String) -> Result<PromiseRaw<'env, ()>> {
        self.check()?;
        let rx = self.engine.save_session(&self.handle, std::path::Path::new(&path));
        env.spawn_future(async move { rx.await.map_err(|_| disposed("runtime"))?.map_err(to_napi) })
    }

    #[napi]
    pub fn reset(&self) -> Result<()> {
        self.check()?;
        self.engine.reset_session(&self.handle).map_err(to_napi)
    }

    #[napi]
    pub fn dispose(&self) {
        if !self.disposed.swap(true, Ordering::AcqRel) {
            self.engine.drop_session(self.handle.id);
        }
    }
}

impl Drop for NativeSession {
    fn drop(&mut self) {
        self.dispose();
    }
}
