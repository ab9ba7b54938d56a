//! A KV pool in half precision or block-quantized (q8_0, q4_0) against the f32 pool:
//! teacher-forced logprobs over 192 tokens (one pass, every row attending through the pool) on
//! the tiny fixtures, and over a real SmolLM2 prompt and answer when `$EXPERT_RUNTIME_SMOLLM2`
//! names it (weights dequantized), plus greedy agreement over 256 steps there. Prints mean and
//! max |Δlogprob|.

use std::path::{Path, PathBuf};

use crate::common::{fixture, ids, load, log_softmax, read_json};
use candle_core::DType;
use expert_runtime::engine::LoadOptions;
use expert_runtime::kv::quant::Quant;
use expert_runtime::kv::KvFormat;
use expert_runtime::model::decoder::Logits;
use expert_runtime::model::Decoder;

/// Next-token logprobs of `seq` with the pool stored as `kv`.
fn logprobs(model: &Decoder, seq: &[u32], kv: impl Into<KvFormat>) -> Vec<f32> {
    let mut cache = model.new_cache_as(seq.len(), kv).unwrap();
    let rows: Vec<Vec<f32>> = model.forward(seq, &mut cache, Logits::All).unwrap().to_vec2().unwrap();
    rows.iter().take(seq.len() - 1).enumerate().map(|(i, r)| log_softmax(r)[seq[i + 1] as usize]).collect()
}

/// The pool formats compared with f32.
const FORMATS: [KvFormat; 4] =
    [KvFormat::Dense(DType::F16), KvFormat::Dense(DType::BF16), KvFormat::Quant(Quant::Q8_0), KvFormat::Quant(Quant::Q4_0)];

/// (mean, max) |Δlogprob| against f32 of each of `formats`.
fn deltas<const N: usize>(path: &Path, seq: &[u32], dequantize: bool, formats: [KvFormat; N]) -> [(f32, f32); N] {
    let model = load(path, &LoadOptions { context_length: Some(seq.len()), dequantize, ..Default::default() });
    let base = logprobs(&model, seq, DType::F32);
    formats.map(|kv| {
        let d: Vec<f32> = logprobs(&model, seq, kv).iter().zip(&base).map(|(a, b)| (a - b).abs()).collect();
        (d.iter().sum::<f32>() / d.len() as f32, d.iter().copied().fold(0.0, f32::max))
    })
}

/// f16 keeps 11 significant bits, bf16 8: these tiny models (init 0.2, large activations) are
/// harsher on rounding than real ones.
const F16_MAX: f32 = 1e-2;
const BF16_MAX: f32 = 8e-2;
/// Block-quantized pools on qwen3-tiny (8 and 4 bits per value plus a scale per 32;
/// measured max 9.1e-2 and 1.3).
const Q8_0_MAX: f32 = 1.5e-1;
const Q4_0_MAX: f32 = 2.0;

#[test]
fn half_precision_pools_on_the_fixtures() {
    let seq = ids(&read_json(&fixture("rope/qwen3-yarn.json"))["teacher_forced"]["ids"]);
    for m in ["qwen3-tiny", "qwen3-untied-mqa", "qwen2-tiny", "llama-tiny"] {
        let [(f16_mean, f16_max), (bf16_mean, bf16_max)] = deltas(&fixture(m), &seq, false, [FORMATS[0], FORMATS[1]]);
        eprintln!("{m}: f16 mean {f16_mean:.1e} max {f16_max:.1e}; bf16 mean {bf16_mean:.1e} max {bf16_max:.1e}");
        assert!(f16_max > 0.0, "{m}: an f16 pool changed nothing (is it really f16?)");
        assert!(f16_max <= F16_MAX && bf16_max <= BF16_MAX, "{m}: f16 {f16_max}, bf16 {bf16_max}");
        assert!(f16_mean < bf16_mean, "{m}: f16 is the finer format");
    }
}

/// qwen3-tiny is the fixture whose head dimension (32) is whole quantization blocks; the
/// others (16) refuse a quantized pool.
#[test]
fn quantized_pools_on_the_fixtures() {
    let seq = ids(&read_json(&fixture("rope/qwen3-yarn.json"))["teacher_forced"]["ids"]);
    let [(f16_mean, _), _, (q8_mean, q8_max), (q4_mean, q4_max)] = deltas(&fixture("qwen3-tiny"), &seq, false, FORMATS);
    eprintln!("qwen3-tiny: q8_0 mean {q8_mean:.1e} max {q8_max:.1e}; q4_0 mean {q4_mean:.1e} max {q4_max:.1e}");
    assert!(q8_max <= Q8_0_MAX && q4_max <= Q4_0_MAX, "q8_0 {q8_max}, q4_0 {q4_max}");
    assert!(
        f16_mean < q8_mean && q8_mean < q4_mean,
        "finer formats are nearer f32: f16 {f16_mean}, q8_0 {q8_mean}, q4_0 {q4_mean}"
    );
    let model = load(&fixture("llama-tiny"), &LoadOptions::default());
    let e = model.new_cache_as(8, KvFormat::Quant(Quant::Q8_0)).err().expect("head_dim 16 is refused");
    assert!(e.to_string().contains("multiple of 32"), "{e}");
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
    let [(f16_mean, f16_max), (bf16_mean, bf16_max), (q8_mean, q8_max), (q4_mean, q4_max)] = deltas(&path, &seq, true, FORMATS);
    eprintln!(
        "smollm2 ({} tokens): f16 mean {f16_mean:.1e} max {f16_max:.1e}; bf16 mean {bf16_mean:.1e} max {bf16_max:.1e}; \
         q8_0 mean {q8_mean:.1e} max {q8_max:.1e}; q4_0 mean {q4_mean:.1e} max {q4_max:.1e}",
        seq.len()
    );
    assert!(f16_max <= F16_MAX && bf16_max <= BF16_MAX, "f16 {f16_max}, bf16 {bf16_max}");
    assert!(q8_mean <= SMOLLM2_Q8_0.0 && q8_max <= SMOLLM2_Q8_0.1, "q8_0 mean {q8_mean} max {q8_max}");
    assert!(q4_mean <= SMOLLM2_Q4_0.0 && q4_max <= SMOLLM2_Q4_0.1, "q4_0 mean {q4_mean} max {q4_max}");
}

/// (mean, max) bounds on SmolLM2 (weights dequantized). Measured: q8_0 mean 1.8e-2 max 0.14,
/// q4_0 mean 0.46 max 7.2: SmolLM2's keys have outlier channels, and a block's scale follows
/// its largest value, so the small values of that block keep few levels.
const SMOLLM2_Q8_0: (f32, f32) = (3e-2, 0.25);
const SMOLLM2_Q4_0: (f32, f32) = (0.7, 10.0);

/// Greedy decoding of the SmolLM2 reference prompt for 256 steps with each pool format: how
/// many leading tokens equal the f32 pool's (reported; f16 must agree throughout).
#[test]
fn greedy_agreement_on_smollm2() {
    let Some(path) = std::env::var_os("EXPERT_RUNTIME_SMOLLM2").map(PathBuf::from).filter(|p| p.exists()) else {
        eprintln!("skipped: EXPERT_RUNTIME_SMOLLM2 does not name the SmolLM2 GGUF");
        return;
    };
    const STEPS: usize = 256;
    let prompt = ids(&read_json(&fixture("smollm2-reference.json"))["prompt_ids"]);
    let model = load(&path, &LoadOptions { context_length: Some(prompt.len() + STEPS), dequantize: true, ..Default::default() });
    let greedy = |kv: KvFormat| -> Vec<u32> {
        let mut cache = model.new_cache_as(prompt.len() + STEPS, kv).unwrap();
        let mut out = Vec::new();
        let mut next: Vec<u32> = prompt.clone();
        for _ in 0..STEPS {
            let row: Vec<f32> = model.forward(&next, &mut cache, Logits::Last).unwrap().to_vec1().unwrap();
            let t = (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a))).unwrap() as u32;
            out.push(t);
            next = vec![t];
        }
        out
    };
    let base = greedy(KvFormat::Dense(DType::F32));
    let mut report = Vec::new();
    for kv in FORMATS {
        let got = greedy(kv);
        let same = got.iter().zip(&base).take_while(|(a, b)| a == b).count();
        report.push(format!("{} {same}/{STEPS}", kv.name()));
        if kv == FORMATS[0] {
            assert_eq!(same, STEPS, "an f16 pool changes the greedy answer");
        }
    }
    eprintln!("smollm2 greedy agreement with the f32 pool over {STEPS} steps: {}", report.join(", "));
}
