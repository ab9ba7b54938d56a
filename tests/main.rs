//! The integration tests, built as one test binary: each binary links the whole engine with the
//! release profile's thin LTO (about three minutes on two cores), so one binary instead of six
//! saves CI a quarter of an hour. Each file keeps its own subject; run one with
//! `cargo test --release --no-default-features --test integration parity::`.

mod common;

mod embeddings;
mod experts;
mod gemma3;
mod gemma3_multimodal;
mod gemma4;
mod gemma4_moe;
mod granite;
mod hybrid;
mod kv_dtype;
mod mistral;
mod parity;
mod phi3;
mod quantize;
mod qwen3moe;
mod rope;
mod smollm3;
