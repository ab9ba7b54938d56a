//! Decoder-only transformer models: configuration, weight loading and the forward pass.
//! One decoder covers the Llama, Qwen2 and Qwen3 families, switched by [`config::ModelConfig`].
pub mod adapt;
pub mod block_quant;
pub mod config;
pub mod decoder;
pub mod inspect;
pub mod kquant;
pub mod linear;
pub mod loader;
pub mod mapped;
mod nibbles;
pub mod q8;
pub mod quantize;
pub mod repack;
pub mod rope;
mod tiled;

pub use config::{Arch, ModelConfig};
pub use decoder::Decoder;
pub use tiled::PackedMatrix;
