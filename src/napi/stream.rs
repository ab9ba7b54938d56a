//! `TokenStream`: a JS async iterator over one request's events, fed by the engine through a
//! channel. `return()` (a `break` in `for await`) and `cancel()` set the request's cancel flag;
//! the engine stops within one step and sends the summary, readable with `summary()`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use napi::bindgen_prelude::*;
use napi_derive::napi;
use tokio::sync::mpsc::UnboundedReceiver;

use super::error::to_napi;
use super::types::{JsCompletion, JsTokenChunk};
use crate::engine::{Completion, Delivery, Event, Generation};

#[napi(async_iterator)]
pub struct TokenStream {
    events: Arc<tokio::sync::Mutex<UnboundedReceiver<Event>>>,
    cancel: Arc<AtomicBool>,
    summary: Arc<Mutex<Option<Completion>>>,
    delivery: Arc<Mutex<Delivery>>,
}

impl TokenStream {
    pub fn new(g: Generation) -> Self {
        Self {
            events: Arc::new(tokio::sync::Mutex::new(g.events)),
            cancel: g.cancel,
            summary: Arc::default(),
            delivery: Arc::new(Mutex::new(g.delivery)),
        }
    }
}

#[napi]
impl AsyncGenerator for TokenStream {
    type Yield = JsTokenChunk;
    type Next = ();
    type Return = ();

    fn next(&mut self, _value: Option<()>) -> impl std::future::Future<Output = Result<Option<JsTokenChunk>>> + Send + 'static {
        let events = self.events.clone();
        let summary = self.summary.clone();
        let delivery = self.delivery.clone();
        async move {
            let mut rx = events.lock().await;
            match rx.recv().await {
                Some(Event::Token(c)) => {
                    delivery.lock().unwrap().passed(&c);
                    Ok(Some(c.into()))
                }
                Some(Event::Done(mut c)) => {
                    delivery.lock().unwrap().settle(&mut c);
                    *summary.lock().unwrap() = Some(*c);
                    rx.close();
                    Ok(None)
                }
                Some(Event::Error(e)) => {
                    rx.close();
                    Err(to_napi(e))
                }
                None => Ok(None),
            }
        }
    }

    fn complete(
        &mut self,
        _value: Option<()>,
    ) -> impl std::future::Future<Output = Result<Option<JsTokenChunk>>> + Send + 'static {
        self.cancel.store(true, Ordering::Relaxed);
        async { Ok(None) }
    }
}

#[napi]
impl TokenStream {
    /// Asks the engine to stop this request after the current step. `delivered`: how many
    /// chunks reached the consumer; the summary, the history and the session keep those only
    /// (also when the engine had already finished the answer).
    #[napi]
    pub fn cancel(&self, delivered: Option<u32>) {
        if let Some(n) = delivered {
            self.delivery.lock().unwrap().left_after(n as usize);
        }
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// The request's summary, once the stream has ended normally.
    #[napi]
    pub fn summary(&self) -> Option<JsCompletion> {
        self.summary.lock().unwrap().clone().map(Into::into)
    }
}
