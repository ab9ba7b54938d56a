//! A KV pool in half precision against the f32 pool: teacher-forced logprobs over 192 tokens
//! (one pass, every row attending through the pool) on the tiny fixtures, and over a real
//! SmolLM2 prompt and answer when `$EXPERT_RUNTIME_SMOLLM2` names it (weights dequantized).
//! Prints mean and max |Δlogprob|.

mod common;

use std::path::{Path, PathBuf};

use candle_core::DType;
use common::{fixture, ids, load, log_softmax, read_json};
use expert_runtime::engine::LoadOptions;
use expert_runtime::model::decoder::Logits;
use expert_runtime::model::Decoder;

/// Next-token logprobs of `seq` with the pool stored as `kv`.
fn logprobs(model: &Decoder, seq: &[u32], kv: DType) -> Vec<f32> {
    let mut cache = model.new_cache_as(seq.len(), kv).unwrap();
    let rows: Vec<Vec<f32>> = model.forward(seq, &mut cache, Logits::All).unwrap().to_vec2().unwrap();
    rows.iter().take(seq.len() - 1).enumerate().map(|(i, r)| log_softmax(r)[seq[i + 1] as usize]).collect()
}

/// (mean, max) |Δlogprob| of each half-precision pool against f32.
fn deltas(path: &Path, seq: &[u32], dequantize: bool) -> [(f32, f32); 2] {
    let model = load(path, &LoadOptions { context_length: Some(seq.len()), dequantize, ..Default::default() });
    let base = logprobs(&model, seq, DType::F32);
    [DType::F16, DType::BF16].map(|kv| {
        let d: Vec<f32> = logprobs(&model, seq, kv).iter().zip(&base).map(|(a, b)| (a - b).abs()).collect();
        (d.iter().sum::<f32>() / d.len() as f32, d.iter().copied().fold(0.0, f32::max))
    })
}

/// f16 keeps 11 significant bits, bf16 8: these tiny models (init 0.2, large activations) are
/// harsher on rounding than real ones.
const F16_MAX: f32 = 1e-2;
const BF16_MAX: f32 = 8e-2;

#[test]
fn half_precision_pools_on_the_fixtures() {
    let seq = ids(&read_json(&fixture("rope/qwen3-yarn.json"))["teacher_forced"]["ids"]);
    for m in ["qwen3-tiny", "qwen3-untied-mqa", "qwen2-tiny", "llama-tiny"] {
        let [(f16_mean, f16_max), (bf16_mean, bf16_max)] = deltas(&fixture(m), &seq, false);
        eprintln!("{m}: f16 mean {f16_mean:.1e} max {f16_max:.1e}; bf16 mean {bf16_mean:.1e} max {bf16_max:.1e}");
        assert!(f16_max > 0.0, "{m}: an f16 pool changed nothing (is it really f16?)");
        assert!(f16_max <= F16_MAX && bf16_max <= BF16_MAX, "{m}: f16 {f16_max}, bf16 {bf16_max}");
        assert!(f16_mean < bf16_mean, "{m}: f16 is the finer format");
    }
}

#[test]
fn half_precision_pools_on_smollm2() {
    let Some(path) = std::env::var_os("EXPERT_RUNTIME_SMOLLM2").map(PathBuf::from).filter(|p| p.exists()) else {
        eprintln!("skipped: EXPERT_RUNTIME_SMOLLM2 does not name the SmolLM2 GGUF");
        return;
    };
    let r = read_json(&fixture("smollm2-reference.json"));
    let mut seq = ids(&r["prompt_ids"]);
    seq.extend(r["steps"].as_array().unwrap().iter().map(|s| s["token"].as_u64().unwrap() as u32));
    // Dequantized weights: the quantized kernels also round activations to 8 bits per block,
    // which turns any small change upstream (this one included) into whole quanta downstream
    // (up to 0.7 here, measured) and would hide what the pool's dtype itself costs.
    let [(f16_mean, f16_max), (bf16_mean, bf16_max)] = deltas(&path, &seq, true);
    eprintln!(
        "smollm2 ({} tokens): f16 mean {f16_mean:.1e} max {f16_max:.1e}; bf16 mean {bf16_mean:.1e} max {bf16_max:.1e}",
        seq.len()
    );
    assert!(f16_max <= F16_MAX && bf16_max <= BF16_MAX, "f16 {f16_max}, bf16 {bf16_max}");
}
