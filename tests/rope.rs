//! RoPE scaling against HF transformers (`scripts/gen_rope_fixtures.py` wrote the references):
//! each case is a tiny fixture model given a 64-position original context and a scaling type,
//! read from its config.json (4.x or 5.x form) or from GGUF metadata, then teacher-forced over
//! 192 tokens in one pass. Every next-token logprob must be within 1e-4 of HF's (f32).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::common::{fixture, ids, load, log_softmax, read_json};
use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use expert_runtime::engine::LoadOptions;
use expert_runtime::model::decoder::Logits;
use expert_runtime::model::Decoder;
use serde_json::Value;

const TOL: f32 = 1e-4;

fn case(name: &str) -> Value {
    read_json(&fixture("rope").join(format!("{name}.json")))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("expert-runtime-rope-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The case's base model with its config.json patched as the case says.
fn model_dir(name: &str, c: &Value) -> PathBuf {
    let base = fixture(c["base"].as_str().unwrap());
    let dir = scratch(name);
    for f in std::fs::read_dir(&base).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|e| e == "safetensors" || e == "json") {
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
    }
    let mut cfg = read_json(&base.join("config.json"));
    for (k, v) in c["config"].as_object().unwrap() {
        cfg[k] = v.clone();
    }
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

/// Max |Δlogprob| of the teacher-forced next tokens against HF's, and how many greedy picks
/// differ where our top-2 margin is clear.
fn teacher_forced(model: &Decoder, c: &Value) -> (f32, usize) {
    let tf = &c["teacher_forced"];
    let seq = ids(&tf["ids"]);
    let mut cache = model.new_cache(seq.len()).unwrap();
    let rows: Vec<Vec<f32>> = model.forward(&seq, &mut cache, Logits::All).unwrap().to_vec2().unwrap();
    let (want, argmax) = (tf["logprobs"].as_array().unwrap(), ids(&tf["argmax"]));
    let (mut worst, mut picks) = (0f32, 0);
    for (i, row) in rows.iter().take(seq.len() - 1).enumerate() {
        let lp = log_softmax(row);
        worst = worst.max((lp[seq[i + 1] as usize] - want[i].as_f64().unwrap() as f32).abs());
        let mut sorted = lp.clone();
        sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
        if sorted[0] - sorted[1] > 2.0 * TOL && crate::common::argmax(&lp) != argmax[i] {
            picks += 1;
        }
    }
    (worst, picks)
}

fn opts(context_length: usize) -> LoadOptions {
    LoadOptions { context_length: Some(context_length), ..Default::default() }
}

fn check(name: &str) {
    let c = case(name);
    let dir = model_dir(name, &c);
    let n = c["teacher_forced"]["ids"].as_array().unwrap().len();
    let model = load(&dir, &opts(n));
    let (worst, picks) = teacher_forced(&model, &c);
    assert!(worst <= TOL && picks == 0, "{name}: max |Δlogprob| {worst} (bound {TOL}), {picks} greedy picks differ");
    // The test can fail: the same model without the scaling is far off past position 64.
    let plain = load(&dir, &LoadOptions { rope_scaling: Some(Value::Null), ..opts(n) });
    let (unscaled, _) = teacher_forced(&plain, &c);
    assert!(unscaled > 100.0 * TOL, "{name}: the scaling changes nothing ({unscaled})");
    eprintln!("{name}: max |Δlogprob| {worst:.2e} (without scaling: {unscaled:.2e})");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn qwen3_each_scaling_type() {
    for t in ["yarn", "linear", "dynamic", "llama3"] {
        check(&format!("qwen3-{t}"));
    }
}

#[test]
fn qwen2_each_scaling_type() {
    for t in ["yarn-mscale", "linear", "dynamic", "llama3"] {
        check(&format!("qwen2-{t}"));
    }
}

#[test]
fn llama_each_scaling_type() {
    for t in ["yarn", "linear", "dynamic", "llama3"] {
        check(&format!("llama-{t}"));
    }
}

/// The `ropeScaling` option replaces what config.json says (camelCase keys).
#[test]
fn the_option_overrides_the_config() {
    let c = case("qwen3-yarn");
    let dir = model_dir("option", &c);
    std::fs::write(
        dir.join("config.json"),
        {
            let mut cfg = read_json(&dir.join("config.json"));
            cfg["rope_scaling"] = Value::Null;
            cfg
        }
        .to_string(),
    )
    .unwrap();
    let v = serde_json::json!({"type": "yarn", "factor": 4, "originalMaxPositionEmbeddings": 64});
    let model = load(&dir, &LoadOptions { rope_scaling: Some(v), ..opts(192) });
    let (worst, picks) = teacher_forced(&model, &c);
    assert!(worst <= TOL && picks == 0, "max |Δlogprob| {worst}, {picks} picks differ");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A GGUF copy of `src` with `meta` added (and `context_length` set), plus `extra` tensors.
fn gguf_with(src: &Path, name: &str, meta: &[(&str, gguf_file::Value)], extra: Vec<(&str, QTensor)>) -> PathBuf {
    let mut f = File::open(src).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut md: HashMap<String, gguf_file::Value> = content.metadata.clone();
    for (k, v) in meta {
        md.insert(k.to_string(), v.clone());
    }
    let mut tensors: Vec<(String, QTensor)> =
        content.tensor_infos.keys().map(|k| (k.clone(), content.tensor(&mut f, k, &Device::Cpu).unwrap())).collect();
    tensors.extend(extra.into_iter().map(|(k, t)| (k.to_string(), t)));
    let path = scratch(name).join("model.gguf");
    let md_refs: Vec<(&str, &gguf_file::Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    gguf_file::write(&mut File::create(&path).unwrap(), &md_refs, &t_refs).unwrap();
    path
}

/// YaRN from GGUF metadata (`qwen3.rope.scaling.*`, as llama.cpp's converter writes it).
#[test]
fn gguf_yarn_metadata() {
    let c = case("qwen3-yarn");
    let meta = [
        ("qwen3.context_length", gguf_file::Value::U32(256)),
        ("qwen3.rope.scaling.type", gguf_file::Value::String("yarn".into())),
        ("qwen3.rope.scaling.factor", gguf_file::Value::F32(4.0)),
        ("qwen3.rope.scaling.original_context_length", gguf_file::Value::U32(64)),
    ];
    let path = gguf_with(&fixture("qwen3-tiny/model-f32.gguf"), "gguf-yarn", &meta, vec![]);
    let model = load(&path, &opts(192));
    let (worst, picks) = teacher_forced(&model, &c);
    assert!(worst <= TOL && picks == 0, "max |Δlogprob| {worst}, {picks} picks differ");
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

/// Llama 3 scaling as GGUF carries it: a `rope_freqs` tensor of per-frequency divisors.
#[test]
fn gguf_llama3_rope_freqs() {
    let c = case("llama-llama3");
    let divisors: Vec<f32> = c["gguf_rope_freqs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let n = divisors.len();
    let t = QTensor::quantize(&Tensor::from_vec(divisors, n, &Device::Cpu).unwrap(), GgmlDType::F32).unwrap();
    let path = gguf_with(&fixture("llama-tiny/model-f32.gguf"), "gguf-llama3", &[], vec![("rope_freqs.weight", t)]);
    let model = load(&path, &opts(192));
    let (worst, picks) = teacher_forced(&model, &c);
    assert!(worst <= TOL && picks == 0, "max |Δlogprob| {worst}, {picks} picks differ");
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}
