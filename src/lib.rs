//! expert-runtime: an LLM inference engine with run-time PEFT experts.
pub mod backend;
pub mod engine;
pub mod error;
pub mod experts;
pub mod gguf_meta;
pub mod model;
pub mod sampling;
pub mod simd;
pub mod tokenizer;
pub mod kv;
#[cfg(feature = "node")]
pub mod napi;
