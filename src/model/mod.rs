//! Decoder-only transformer models: configuration, weight loading and the forward pass.
//! A configuration ([`config::ModelConfig`]) resolves into a layer plan ([`plan::LayerPlan`]:
//! what each layer runs), and one decoder runs any plan it supports.
pub mod adapt;
pub mod block_quant;
pub mod config;
pub mod decoder;
mod delta_net;
mod delta_rule;
pub mod footprint;
mod gemma3_config;
pub mod gemma4_config;
mod gguf_names;
mod gguf_source;
pub mod granite_config;
pub mod hybrid_config;
pub mod inspect;
pub mod kquant;
mod layer;
pub mod linear;
pub mod loader;
pub mod mapped;
mod moe;
pub mod moe_config;
mod multimodal;
mod nibbles;
mod phi3_config;
pub mod plan;
pub mod q8;
pub mod quantize;
pub mod repack;
pub mod rope;
mod short_conv;
mod smollm3_config;
mod table;
mod tiled;
mod unimplemented;
mod window_config;

pub use config::{Arch, ModelConfig};
pub use decoder::Decoder;
pub use tiled::PackedMatrix;
