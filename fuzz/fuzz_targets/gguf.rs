//! A GGUF file as the loader reads it: candle's header reader (through
//! `loader::read_gguf_header`), the model config and the tokenizer from its metadata (with the
//! checks `engine::load` runs at load), and each tensor's extent and data as
//! `GgufSource::read` / `linear` handle them.

#![no_main]

mod common;

use std::io::Cursor;

use candle_core::quantized::GgmlDType;
use candle_core::Device;
use expert_runtime::model::config::ModelConfig;
use expert_runtime::model::loader::{gguf_tensor_extent, read_gguf_header};
use expert_runtime::model::linear::Weight;
use expert_runtime::model::repack;
use expert_runtime::tokenizer::{ChatMessage, Tokenizer};
use libfuzzer_sys::fuzz_target;

/// Tensors read per input.
const MAX_TENSORS: usize = 8;

fuzz_target!(init: common::report_panics_once(), |data: &[u8]| {
    let mut reader = Cursor::new(data);
    let header = read_gguf_header(&mut reader, "fuzz input");
    common::show("header", &header);
    let Ok(content) = header else { return };
    let config = ModelConfig::from_gguf(&content.metadata);
    common::show("config", &config);

    // engine::load::load_model: the tokenizer from the metadata, then check_tokenizer.
    let tokenizer = Tokenizer::from_gguf(&content.metadata);
    common::show("tokenizer", &tokenizer);
    if let Ok(tok) = tokenizer {
        let _ = config.as_ref().map(|c| tok.vocab_size() > c.vocab_size);
        let ids = tok.encode("Hello, world! 123 日本", true);
        common::show("encode", &ids);
        if let Ok(ids) = ids {
            common::show("decode", &tok.decode(&ids, true));
        }
        common::show("template check", &tok.check_chat_template());
        common::show("template", &tok.apply_chat_template(&[ChatMessage::new("user", "hi")], true, Some(false)));
    }

    // GgufSource::read: the extent check, then candle's read; GgufSource::linear: the CPU
    // repacking of 2-D quantized weights.
    let device = Device::Cpu;
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    for name in names.into_iter().take(MAX_TENSORS) {
        let extent = gguf_tensor_extent(&content, name, data.len() as u64);
        common::show(&format!("tensor {name} extent"), &extent);
        if extent.is_err() {
            continue;
        }
        let q = content.tensor(&mut reader, name, &device);
        common::show(&format!("tensor {name}"), &q);
        let Ok(q) = q else { continue };
        common::show(&format!("tensor {name} dequantize"), &q.dequantize(&device));
        if q.shape().rank() == 2 && !matches!(q.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) {
            // The repacking a CPU load does: Q4_1 / Q5_1 to Q8_0, then our kernels' layouts.
            if let Ok(q) = repack::for_cpu(q, &device) {
                let _ = Weight::from_qtensor(q, &device);
            }
        }
    }
});
