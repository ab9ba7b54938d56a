//! Engine errors become JS errors whose message starts with the stable code
//! (`"MODEL_NOT_FOUND: …"`); the TS layer lifts it into `err.code` (lib/errors.ts).

use crate::error::EngineError;

pub fn to_napi(e: EngineError) -> napi::Error {
    napi::Error::new(napi::Status::GenericFailure, format!("{}: {}", e.code(), e.message()))
}

pub fn disposed(what: &str) -> napi::Error {
    to_napi(EngineError::Disposed(format!("the {what} was disposed")))
}

pub fn invalid(msg: impl Into<String>) -> napi::Error {
    to_napi(EngineError::InvalidArgument(msg.into()))
}
