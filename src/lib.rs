//! expert-runtime: an LLM inference engine with run-time PEFT experts.
pub mod backend;
pub mod bounded;
pub mod engine;
pub mod error;
pub mod experts;
pub mod files;
pub mod gguf_meta;
pub mod inspect;
pub mod kv;
pub mod memory;
pub mod model;
#[cfg(feature = "node")]
pub mod napi;
#[cfg(feature = "python")]
pub mod python;
pub mod sampling;
pub mod simd;
pub mod stack;
pub mod tokenizer;

/// The system allocator, with untrusted work's threads held to their budgets ([`bounded`]).
#[global_allocator]
static ALLOCATOR: bounded::Metered = bounded::Metered;
