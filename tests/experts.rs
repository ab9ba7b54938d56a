//! Experts against PEFT: every adapter kind in `__test__/fixtures/adapters`
//! (`scripts/gen_adapters.py` wrote them and PEFT's greedy references) must give identical
//! greedy tokens and logprobs within 1e-4 in f32, alone and composed; on GGUF bases (q/k rows
//! permuted for interleaved RoPE, and quantized) the same adapter must agree too.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::{argmax, fixture, ids, load, log_softmax, read_json};
use expert_runtime::engine::LoadOptions;
use expert_runtime::experts::{load_expert, ExpertLoadOptions, ExpertSet};
use expert_runtime::model::decoder::Logits;
use expert_runtime::model::Decoder;
use serde_json::Value;

fn reference() -> Value {
    read_json(&fixture("adapters/reference.json"))
}

pub fn model(path: &Path, dequantize: bool) -> Decoder {
    let opts = LoadOptions { dtype: Some("f32".into()), dequantize, ..Default::default() };
    load(path, &opts)
}

/// The experts `names` of directory `dir`, in one set.
pub fn experts(model: &Decoder, dir: &Path, names: &[&str]) -> ExpertSet {
    let list = names
        .iter()
        .enumerate()
        .map(|(i, n)| Arc::new(load_expert(&dir.join(n), &ExpertLoadOptions::default(), model, i as u64 + 1).unwrap()))
        .collect();
    ExpertSet::new(list)
}

/// Greedy decoding under `set`: prefill, then one token at a time through the cache (so both
/// the prefill and the single-row adapter paths run). Returns the tokens and each step's
/// log-softmax.
fn greedy(model: &Decoder, set: &ExpertSet, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut cache = model.new_cache(64).unwrap();
    let (mut toks, mut lps) = (Vec::new(), Vec::new());
    let mut input = prompt.to_vec();
    for _ in 0..n {
        let logits: Vec<f32> = model.forward_with(&input, &mut cache, Logits::Last, set).unwrap().to_vec1().unwrap();
        let lp = log_softmax(&logits);
        let tok = argmax(&lp);
        toks.push(tok);
        lps.push(lp);
        input = vec![tok];
    }
    (toks, lps)
}

/// Greedy tokens equal to PEFT's and every top-5 logprob within `tol`; returns the worst |Δ|.
fn check_case(case: &str, model_path: &Path, dequantize: bool, tol: f32) -> f32 {
    check_case_in(&reference(), &fixture("adapters"), case, model_path, dequantize, tol)
}

/// [`check_case`] for case `case` of `reference` (the schema of `adapters/reference.json`),
/// its experts in `adapters`.
pub fn check_case_in(reference: &Value, adapters: &Path, case: &str, model_path: &Path, dequantize: bool, tol: f32) -> f32 {
    let c = &reference["cases"][case];
    let model = model(model_path, dequantize);
    let names: Vec<&str> = c["experts"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
    let set = experts(&model, adapters, &names);
    let steps = c["steps"].as_array().unwrap();
    let (toks, lps) = greedy(&model, &set, &ids(&c["prompt_ids"]), steps.len());
    let want: Vec<u32> = steps.iter().map(|s| s["token"].as_u64().unwrap() as u32).collect();
    assert_eq!(toks, want, "{case} on {}: greedy tokens differ from PEFT", model_path.display());
    let mut worst = 0f32;
    for (step, lp) in steps.iter().zip(&lps) {
        for pair in step["top5"].as_array().unwrap() {
            let d = (lp[pair[0].as_u64().unwrap() as usize] - pair[1].as_f64().unwrap() as f32).abs();
            worst = worst.max(d);
        }
    }
    assert!(worst <= tol, "{case}: max |Δlogprob| {worst} > {tol}");
    eprintln!("{case} on {}: max |Δlogprob| vs PEFT = {worst:.2e}", model_path.display());
    worst
}

fn hf(base: &str) -> PathBuf {
    fixture(base)
}

pub const F32_TOL: f32 = 1e-4;

macro_rules! peft_parity {
    ($($test:ident: $case:literal on $base:literal;)*) => {$(
        #[test]
        fn $test() {
            check_case($case, &hf($base), false, F32_TOL);
        }
    )*};
}

peft_parity! {
    base_qwen3_unchanged: "qwen3-tiny" on "qwen3-tiny";
    lora: "lora" on "qwen3-tiny";
    lora_second: "lora2" on "qwen3-tiny";
    two_loras_composed: "lora+lora2" on "qwen3-tiny";
    rslora_regex_targets: "rslora" on "qwen3-tiny";
    lora_rank_and_alpha_patterns: "lora_patterns" on "qwen3-tiny";
    dora: "dora" on "qwen3-tiny";
    ia3_attention_and_feedforward: "ia3" on "qwen3-tiny";
    lokr: "lokr" on "qwen3-tiny";
    lokr_decompose_both: "lokr_both" on "qwen3-tiny";
    prompt_tuning: "prompt" on "qwen3-tiny";
    ia3_with_bias: "ia3_qwen2" on "qwen2-tiny";
    lora_with_bias: "lora_qwen2" on "qwen2-tiny";
    lora_llama: "lora_llama" on "llama-tiny";
    dora_llama: "dora_llama" on "llama-tiny";
    // Sliding windows (8 and 6) that the 12-token prompt and its 12 new tokens run past.
    base_gemma3_unchanged: "gemma3-tiny" on "gemma3-tiny";
    lora_gemma3: "lora_gemma3" on "gemma3-tiny";
    dora_gemma3: "dora_gemma3" on "gemma3-tiny";
    ia3_gemma3: "ia3_gemma3" on "gemma3-tiny";
    base_mistral_unchanged: "mistral-tiny" on "mistral-tiny";
    lora_mistral: "lora_mistral" on "mistral-tiny";
    dora_mistral: "dora_mistral" on "mistral-tiny";
    ia3_mistral: "ia3_mistral" on "mistral-tiny";
}

/// GGUF Llama stores q/k rows permuted for interleaved RoPE: the adapter's q/k outputs must be
/// permuted the same way. On the F32 GGUF this is exact.
#[test]
fn adapters_on_a_gguf_llama_base_with_permuted_rows() {
    let gguf = fixture("llama-tiny/model-f32.gguf");
    check_case("lora_llama", &gguf, false, F32_TOL);
    check_case("dora_llama", &gguf, false, F32_TOL);
    // The permuted q/k factors are converted into memory; the others are read in place.
    let e = load_expert(&fixture("adapters/lora_llama"), &ExpertLoadOptions::default(), &model(&gguf, false), 1).unwrap();
    assert!(e.mapped_bytes > 0 && e.mapped_bytes < e.bytes, "{} of {} bytes mapped", e.mapped_bytes, e.bytes);
}

/// Bound for an expert on a Q8_0 base (8-bit weights and, on CPU, 8-bit activations) against
/// the same expert on the dequantized weights. The base path alone differs by up to 0.18 on
/// these fixtures (tests/parity.rs, bound 0.2); the adapters run in f32 on top, and measured
/// 0.16 (LoRA) and 0.20 (DoRA, whose row rescaling amplifies the base's activation rounding).
const Q8_TOL: f32 = 0.25;

/// An expert on a GGUF-quantized base equals the same expert on the dequantized base within
/// `Q8_TOL`, teacher-forced on the dequantized run's tokens; and on the dequantized base it
/// equals PEFT.
#[test]
fn experts_on_a_quantized_base_match_the_dequantized_base() {
    let gguf = fixture("llama-tiny/model-q8_0.gguf");
    let r = reference();
    for case in ["lora_llama", "dora_llama"] {
        let c = &r["cases"][case];
        let names: Vec<&str> = c["experts"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
        let prompt = ids(&c["prompt_ids"]);
        let deq = model(&gguf, true);
        let q8 = model(&gguf, false);
        let (set_d, set_q) = (experts(&deq, &fixture("adapters"), &names), experts(&q8, &fixture("adapters"), &names));
        let (toks, lp_d) = greedy(&deq, &set_d, &prompt, 12);
        // Teacher-force the quantized model on the dequantized run's tokens.
        let mut cache = q8.new_cache(64).unwrap();
        let mut input = prompt.clone();
        let mut worst = 0f32;
        for (i, want) in lp_d.iter().enumerate() {
            let logits: Vec<f32> = q8.forward_with(&input, &mut cache, Logits::Last, &set_q).unwrap().to_vec1().unwrap();
            let lp = log_softmax(&logits);
            let mut top: Vec<usize> = (0..want.len()).collect();
            top.sort_by(|&a, &b| want[b].partial_cmp(&want[a]).unwrap());
            for &id in &top[..5] {
                worst = worst.max((lp[id] - want[id]).abs());
            }
            input = vec![toks[i]];
        }
        assert!(worst <= Q8_TOL, "{case}: Q8_0 vs dequantized max |Δlogprob| {worst} > {Q8_TOL}");
        eprintln!("{case}: Q8_0 base vs dequantized base, max |Δlogprob| = {worst:.3} (bound {Q8_TOL})");
        // The dequantized GGUF is the PEFT model up to the weights' Q8_0 rounding, which the
        // reference does not have; its greedy run must still differ from the base model's.
        let (base_toks, _) = greedy(&deq, &ExpertSet::none(), &prompt, 12);
        assert_ne!(toks, base_toks, "{case} does not change the output");
    }
}

#[test]
fn expert_metadata() {
    let m = model(&hf("qwen3-tiny"), false);
    let e = load_expert(&fixture("adapters/lora"), &ExpertLoadOptions::default(), &m, 1).unwrap();
    assert_eq!(e.name, "lora"); // from manifest.json
    assert_eq!(e.kind.as_str(), "lora");
    assert_eq!(e.rank, Some(4));
    assert_eq!(e.target_modules, ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]);
    // 3 layers × Σ r·(in + out) over the 7 projections, f32.
    let cfg = &m.cfg;
    let (h, q, kv, i) = (cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size);
    let per_layer = 4 * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h));
    assert_eq!(e.bytes, cfg.num_layers * per_layer * 4);
    // f32 factors on a CPU f32 model are read in place; `mmap: false` copies them.
    assert_eq!(e.mapped_bytes, e.bytes);
    let copied = load_expert(&fixture("adapters/lora"), &ExpertLoadOptions { mmap: false, ..Default::default() }, &m, 4).unwrap();
    assert_eq!((copied.bytes, copied.mapped_bytes), (e.bytes, 0));
    let manifest = e.manifest.as_ref().unwrap();
    assert_eq!(manifest.routing.keywords.iter().map(|k| k.text.as_str()).collect::<Vec<_>>(), ["sql"]);

    let p = load_expert(&fixture("adapters/prompt"), &ExpertLoadOptions { name: Some("p".into()), ..Default::default() }, &m, 2)
        .unwrap();
    assert_eq!((p.name.as_str(), p.kind.as_str(), p.rank, p.num_virtual_tokens()), ("p", "prompt", None, 4));
    let ia3 = load_expert(&fixture("adapters/ia3"), &ExpertLoadOptions::default(), &m, 3).unwrap();
    assert_eq!((ia3.name.as_str(), ia3.rank), ("ia3", None));
}

/// `scale: 0` turns a LoRA, LoKr or IA³ expert off: the output equals the base model's (DoRA
/// still rescales rows by its magnitudes).
#[test]
fn scale_zero_is_the_base_model() {
    let m = model(&hf("qwen3-tiny"), false);
    let r = reference();
    let prompt = ids(&r["cases"]["lora"]["prompt_ids"]);
    let (base, _) = greedy(&m, &ExpertSet::none(), &prompt, 8);
    for name in ["lora", "lokr", "ia3"] {
        let e =
            load_expert(&fixture("adapters").join(name), &ExpertLoadOptions { scale: 0.0, ..Default::default() }, &m, 1).unwrap();
        let (toks, _) = greedy(&m, &ExpertSet::new(vec![Arc::new(e)]), &prompt, 8);
        assert_eq!(toks, base, "{name} with scale 0");
    }
}

/// An f16 copy of fixture adapter `name` in a temporary directory.
fn f16_adapter(name: &str) -> PathBuf {
    let src = fixture("adapters").join(name);
    let dir = std::env::temp_dir().join(format!("expert-runtime-f16-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("adapter_config.json"), dir.join("adapter_config.json")).unwrap();
    let bytes = std::fs::read(src.join("adapter_model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let halves: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let data = v
                .data()
                .chunks_exact(4)
                .flat_map(|b| half::f16::from_f32(f32::from_le_bytes(b.try_into().unwrap())).to_le_bytes())
                .collect();
            (n, v.shape().to_vec(), data)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = halves
        .iter()
        .map(|(n, shape, data)| {
            (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F16, shape.clone(), data).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("adapter_model.safetensors")).unwrap();
    dir
}

/// A half-precision adapter read in place (the kernels widen f16 as they read) computes exactly
/// what the same adapter widened to f32 at load (`mmap: false`) computes, at half the memory.
#[test]
fn half_precision_adapters_read_in_place_equal_their_f32_copies() {
    let m = model(&hf("qwen3-tiny"), false);
    let r = reference();
    for name in ["lora", "dora"] {
        let dir = f16_adapter(name);
        let load = |mmap: bool, id: u64| {
            let opts = ExpertLoadOptions { name: Some(format!("{name}-{mmap}")), mmap, ..Default::default() };
            Arc::new(load_expert(&dir, &opts, &m, id).unwrap())
        };
        let (mapped, copied) = (load(true, 1), load(false, 2));
        // Only DoRA's rescaling vectors (f32, computed at load) are resident in both.
        let resident = mapped.bytes - mapped.mapped_bytes;
        assert_eq!(copied.bytes - resident, 2 * mapped.mapped_bytes, "{name}");
        assert_eq!(resident == 0, name == "lora");
        let prompt = ids(&r["cases"][name]["prompt_ids"]);
        let (want, want_lp) = greedy(&m, &ExpertSet::new(vec![copied]), &prompt, 8);
        let (got, got_lp) = greedy(&m, &ExpertSet::new(vec![mapped]), &prompt, 8);
        assert_eq!((got, got_lp), (want, want_lp), "{name}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
