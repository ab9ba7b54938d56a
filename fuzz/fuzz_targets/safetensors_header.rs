//! A safetensors file, both ways the runtime reads one: adapter weights through
//! `peft::parse_safetensors` (header, dtype check, widening to f32, non-finite values) with
//! the tensor-name parsing and transposition `experts::load` applies, and model weights the
//! way `SafetensorsSource::tensor` loads them (candle's conversion, then a dtype cast).

#![no_main]

mod common;

use candle_core::safetensors::Load;
use candle_core::{DType, Device};
use expert_runtime::experts::peft::{parse_key, parse_safetensors};
use libfuzzer_sys::fuzz_target;

fuzz_target!(init: common::report_panics_once(), |data: &[u8]| {
    let adapter = parse_safetensors(data, "fuzz input");
    common::show("adapter tensors", &adapter);
    if let Ok(tensors) = adapter {
        for (name, t) in &tensors {
            let _ = parse_key(name);
            if t.shape.len() == 2 {
                let _ = t.transposed();
            }
        }
    }
    if let Ok(st) = safetensors::SafeTensors::deserialize(data) {
        for (name, view) in st.tensors() {
            let t = view.load(&Device::Cpu).and_then(|t| t.to_dtype(DType::F32));
            common::show(&format!("model tensor {name}"), &t);
        }
    }
});
