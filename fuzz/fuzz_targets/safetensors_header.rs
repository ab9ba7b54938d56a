//! A safetensors file, both ways the runtime reads one: adapter weights through
//! `peft::parse_safetensors` (header, dtype check, then each tensor read in place and widened
//! to f32 with its non-finite check) with the tensor-name parsing `experts::load` applies, and model weights the
//! ways `SafetensorsSource` loads them: candle's conversion then a dtype cast, and quantize on
//! load (rows widened from the file's bytes, any alignment, into each block format).

#![no_main]

mod common;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use expert_runtime::experts::peft::{parse_key, parse_safetensors};
use expert_runtime::model::quantize::{quantize_bytes, DenseType};
use libfuzzer_sys::fuzz_target;

fuzz_target!(init: common::report_panics_once(), |data: &[u8]| {
    let adapter = parse_safetensors(data, "fuzz input");
    common::show("adapter tensors", &adapter);
    if let Ok(tensors) = adapter {
        for (name, t) in &tensors {
            let _ = parse_key(name);
            let _ = t.values();
            if let Some(m) = t.mapped() {
                let _ = m.values::<f32>().map(|v| v.iter().sum::<f32>());
            }
        }
    }
    if let Ok(st) = safetensors::SafeTensors::deserialize(data) {
        for (name, view) in st.tensors() {
            let Some(dense) = DenseType::of_safetensors(view.dtype()) else { continue };
            let dtype = match dense {
                DenseType::F32 => DType::F32,
                DenseType::F16 => DType::F16,
                DenseType::BF16 => DType::BF16,
            };
            let t = Tensor::from_raw_buffer(view.data(), dtype, view.shape(), &Device::Cpu).and_then(|t| t.to_dtype(DType::F32));
            common::show(&format!("model tensor {name}"), &t);
            let &[n, k] = view.shape() else { continue };
            // Bounded work per input: quantizing is linear in the (file-backed) size.
            if n.saturating_mul(k) > 1 << 16 {
                continue;
            }
            for f in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4K, GgmlDType::Q6K] {
                let w = quantize_bytes(view.data(), dense, (n, k), f, &name, &Device::Cpu).map(|w| w.size_in_bytes());
                common::show(&format!("quantized {name} {f:?}"), &w);
            }
        }
    }
});
