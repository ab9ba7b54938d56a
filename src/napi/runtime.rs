//! `NativeRuntime`: a loaded model behind the engine thread. Wrapped by lib/runtime.ts.

use std::path::Path;
use std::sync::{Arc, Mutex};

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;

use super::error::{disposed, to_napi};
use super::expert::NativeExpert;
use super::session::NativeSession;
use super::types::{
    JsChatMessage, JsRouteDecision, JsRouterSettings, LoadProgress, NativeEmbedOptions, NativeExpertOptions, NativeInput,
    NativeLoadOptions, RuntimeInfo, RuntimeStats,
};
use crate::engine::{ContextShift, EmbedOptions, Engine, ExpertChoice, KvCacheOptions, LoadOptions, Pooling};
use crate::error::EngineError;
use crate::experts::ExpertLoadOptions;

type ProgressFn = ThreadsafeFunction<LoadProgress, (), LoadProgress, Status, false>;

#[napi]
pub struct NativeRuntime {
    engine: Mutex<Option<Arc<Engine>>>,
}

impl NativeRuntime {
    fn engine(&self) -> Result<Arc<Engine>> {
        self.engine.lock().unwrap().clone().ok_or_else(|| disposed("runtime"))
    }

    /// This runtime's model, to draft for another runtime's requests.
    pub(super) fn draft_model(&self) -> Result<crate::engine::DraftModel> {
        self.engine()?.draft_model().map_err(to_napi)
    }
}

/// The engine's load options from the binding's (their numbers checked by the TypeScript
/// layer: whole and non-negative).
pub(crate) fn load_options(options: Option<NativeLoadOptions>) -> Result<LoadOptions> {
    let o = options.unwrap_or_default();
    let rope_scaling = o
        .rope_scaling
        .as_deref()
        .map(|t| crate::engine::structured::parse_json_text("ropeScaling", t))
        .transpose()
        .map_err(to_napi)?;
    let kv = o.kv_cache.unwrap_or_default();
    Ok(LoadOptions {
        device: o.device,
        dtype: o.dtype,
        context_length: o.context_length.map(|n| n as usize),
        rope_scaling,
        threads: o.threads.map(|n| n as usize),
        dequantize: false,
        quantize: o.quantize,
        mmap: o.mmap,
        kv_cache: KvCacheOptions {
            block_size: kv.block_size.map(|n| n as usize),
            max_tokens: kv.max_tokens.map(|n| n as usize),
            max_bytes: kv.max_bytes.map(|n| n as u64),
            idle_release_ms: kv.idle_release_ms.map(|n| n as u64),
            prefix_cache: kv.prefix_cache,
            dtype: kv.dtype,
            max_sequences: kv.max_sequences.map(|n| n as usize),
            disk: kv.disk.map(|d| crate::kv::disk::DiskOptions { dir: d.dir.into(), max_bytes: d.max_bytes as u64 }),
        },
        context_auto: o.context_length_auto.unwrap_or(false),
        memory_limit: o.memory_limit.map(|n| n as u64),
    })
}

/// Loads a model on a new engine thread; resolves once it is ready. Progress callbacks are
/// queued to the JS thread without blocking the loader.
#[napi]
pub async fn load_runtime(
    path: String,
    options: Option<NativeLoadOptions>,
    #[napi(ts_arg_type = "((progress: LoadProgress) => void) | undefined | null")] on_progress: Option<ProgressFn>,
) -> Result<NativeRuntime> {
    let opts = load_options(options)?;
    let progress: Box<dyn Fn(u64, u64) + Send> = match on_progress {
        Some(f) => Box::new(move |loaded, total| {
            f.call(
                LoadProgress { loaded_bytes: loaded as f64, total_bytes: total as f64 },
                ThreadsafeFunctionCallMode::NonBlocking,
            );
        }),
        None => Box::new(|_, _| {}),
    };
    let rx = Engine::spawn(Path::new(&path), opts, progress);
    let engine =
        rx.await.map_err(|_| to_napi(EngineError::Internal("the engine thread exited during load".into())))?.map_err(to_napi)?;
    Ok(NativeRuntime { engine: Mutex::new(Some(engine)) })
}

#[napi]
impl NativeRuntime {
    #[napi(getter)]
    pub fn info(&self) -> Result<RuntimeInfo> {
        let e = self.engine()?;
        let i = &e.info;
        Ok(RuntimeInfo {
            architecture: i.architecture.clone(),
            family: i.family.clone(),
            dtype: i.dtype.clone(),
            device: i.device.clone(),
            device_name: i.device_name.clone(),
            device_memory_total: i.device_memory_total.map(|b| b as f64),
            vocab_size: i.vocab_size as u32,
            context_length: i.context_length as u32,
            num_layers: i.num_layers as u32,
            hidden_size: i.hidden_size as u32,
            eos_token_ids: i.eos_token_ids.clone(),
            rope_scaling: i.rope_scaling.as_ref().map(|r| r.to_json(true).to_string()),
            kv_cache_dtype: i.kv_cache_dtype.clone(),
            quantization: i.quantization.clone(),
            weight_bytes: i.weight_bytes as f64,
            warnings: i.warnings.clone(),
        })
    }

    /// Special-token spellings are plain text unless `parse_special_tokens`.
    #[napi]
    pub fn tokenize(
        &self,
        text: String,
        add_special_tokens: Option<bool>,
        parse_special_tokens: Option<bool>,
    ) -> Result<Vec<u32>> {
        let tok = self.engine()?.tokenizer().map_err(to_napi)?;
        tok.encode_text(&text, add_special_tokens.unwrap_or(true), parse_special_tokens.unwrap_or(false))
            .map_err(|m| to_napi(EngineError::InvalidModel(m)))
    }

    /// Token ids of a conversation as a request would evaluate it: rendered with the chat
    /// template (`add_generation_prompt`: the assistant's turn opened after it), the markup as
    /// control tokens and the messages as plain text. Off the JS thread.
    #[napi]
    pub async fn tokenize_chat(&self, messages: Vec<JsChatMessage>, add_generation_prompt: bool) -> Result<Vec<u32>> {
        let e = self.engine()?;
        let messages: Vec<crate::tokenizer::ChatMessage> = messages.into_iter().map(Into::into).collect();
        let input = crate::engine::Input::Chat(messages);
        crate::engine::prepare::check_input(&input, e.info.context_length).map_err(to_napi)?;
        let crate::engine::Input::Chat(messages) = input else { unreachable!("built above") };
        let tok = e.tokenizer().map_err(to_napi)?;
        tok.encode_chat(&messages, add_generation_prompt, None, &[]).map_err(to_napi)
    }

    #[napi]
    pub fn detokenize(&self, ids: Vec<u32>) -> Result<String> {
        let e = self.engine()?;
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= e.info.vocab_size) {
            return Err(to_napi(EngineError::InvalidArgument(format!("token id {bad} is out of range"))));
        }
        e.tokenizer().map_err(to_napi)?.decode(&ids, false).map_err(|m| to_napi(EngineError::Internal(m)))
    }

    /// `auto`: each request of the session is routed (then `experts` is ignored).
    /// `context_shift`: `none` (default) or `drop-oldest`.
    #[napi]
    pub fn create_session(
        &self,
        system: Option<String>,
        experts: Option<Vec<String>>,
        auto: Option<bool>,
        context_shift: Option<String>,
    ) -> Result<NativeSession> {
        let e = self.engine()?;
        let choice = if auto == Some(true) { ExpertChoice::Auto } else { ExpertChoice::Named(experts.unwrap_or_default()) };
        let shift = context_shift.as_deref().map(ContextShift::parse).transpose().map_err(to_napi)?.unwrap_or_default();
        let handle = e.create_session_with(system, choice, shift).map_err(to_napi)?;
        Ok(NativeSession::new(e, handle))
    }

    /// A session from a file `NativeSession.save` wrote with this model: its next turn
    /// continues from the saved cache. `context_shift` as for `create_session`.
    #[napi]
    pub async fn restore_session(&self, path: String, context_shift: Option<String>) -> Result<NativeSession> {
        let e = self.engine()?;
        let shift = context_shift.as_deref().map(ContextShift::parse).transpose().map_err(to_napi)?.unwrap_or_default();
        let rx = e.restore_session(Path::new(&path), shift);
        let handle = rx.await.map_err(|_| disposed("runtime"))?.map_err(to_napi)?;
        Ok(NativeSession::new(e, handle))
    }

    /// One vector per text: the final hidden state (after the final norm) pooled over the
    /// text's tokens, computed as rows of the engine's passes.
    #[napi]
    pub async fn embed(&self, texts: Vec<String>, options: Option<NativeEmbedOptions>) -> Result<Vec<Float32Array>> {
        let e = self.engine()?;
        let o = options.unwrap_or(NativeEmbedOptions { pooling: None, normalize: None, experts: None });
        let pooling = match o.pooling.as_deref() {
            None | Some("mean") => Pooling::Mean,
            Some("last") => Pooling::Last,
            Some(p) => return Err(to_napi(EngineError::InvalidArgument(format!("unknown pooling '{p}' (mean, last)")))),
        };
        let opts = EmbedOptions { pooling, normalize: o.normalize.unwrap_or(true), experts: o.experts.unwrap_or_default() };
        let rx = e.embed(texts, opts);
        let v = rx.await.map_err(|_| disposed("runtime"))?.map_err(to_napi)?;
        Ok(v.into_iter().map(Float32Array::new).collect())
    }

    /// The router's decision for `input` (without running it).
    #[napi]
    pub async fn route(&self, input: NativeInput, history_turns: Option<u32>) -> Result<JsRouteDecision> {
        let e = self.engine()?;
        let input = input.into_engine()?;
        let rx = e.route(input, history_turns.map(|n| n as usize));
        Ok(rx.await.map_err(|_| disposed("runtime"))?.map_err(to_napi)?.into())
    }

    /// The decision at once when it needs no embedding (no loaded expert has examples), else
    /// null (then `route`).
    #[napi]
    pub fn route_now(&self, input: NativeInput, history_turns: Option<u32>) -> Result<Option<JsRouteDecision>> {
        let e = self.engine()?;
        let input = input.into_engine()?;
        Ok(e.route_now(&input, history_turns.map(|n| n as usize)).map_err(to_napi)?.map(Into::into))
    }

    #[napi]
    pub fn set_router(&self, settings: JsRouterSettings) -> Result<()> {
        self.engine()?.set_router(settings.into()).map_err(to_napi)
    }

    #[napi(getter)]
    pub fn router(&self) -> Result<JsRouterSettings> {
        Ok(self.engine()?.router_settings().into())
    }

    /// Reads, validates and makes resident a PEFT adapter directory, off the JS thread and
    /// without pausing generation.
    #[napi]
    pub async fn load_expert(&self, path: String, options: Option<NativeExpertOptions>) -> Result<NativeExpert> {
        let e = self.engine()?;
        let o = options.unwrap_or(NativeExpertOptions { name: None, default_name: None, scale: None, mmap: None });
        let opts = ExpertLoadOptions {
            name: o.name,
            default_name: o.default_name,
            scale: o.scale.unwrap_or(1.0),
            mmap: o.mmap.unwrap_or(true),
        };
        let rx = e.load_expert(Path::new(&path), opts);
        let expert =
            rx.await.map_err(|_| to_napi(EngineError::Internal("the adapter loader exited".into())))?.map_err(to_napi)?;
        Ok(NativeExpert::new(e, &expert))
    }

    /// The loaded experts, in load order.
    #[napi]
    pub fn experts(&self) -> Result<Vec<NativeExpert>> {
        let e = self.engine()?;
        Ok(e.experts().map_err(to_napi)?.list().iter().map(|x| NativeExpert::new(e.clone(), x)).collect())
    }

    /// Cancels running requests and stops the engine thread; later calls fail with `DISPOSED`.
    #[napi]
    pub async fn dispose(&self) -> Result<()> {
        let engine = self.engine.lock().unwrap().take();
        if let Some(e) = engine {
            let _ = e.shutdown().await;
        }
        Ok(())
    }

    /// KV pool and scheduler counters (read without waiting for the engine).
    #[napi]
    pub fn stats(&self) -> Result<RuntimeStats> {
        Ok(self.engine()?.stats().into())
    }

    /// Starts recording KV events (what the prefix index stores and removes) for a publisher.
    #[napi]
    pub fn start_kv_events(&self) -> Result<()> {
        self.engine()?.start_kv_events();
        Ok(())
    }

    /// Up to `max` recorded KV events, oldest first (see `startKvEvents`).
    #[napi]
    pub fn take_kv_events(&self, max: u32) -> Result<Vec<super::types::NativeKvEvent>> {
        let e = self.engine()?;
        let block_size = e.kv_block_size() as u32;
        Ok(e.take_kv_events(max as usize).into_iter().map(|ev| super::types::NativeKvEvent::new(ev, block_size)).collect())
    }

    #[napi(getter)]
    pub fn disposed(&self) -> bool {
        self.engine.lock().unwrap().as_ref().is_none_or(|e| e.is_disposed())
    }
}
