//! The estimate against what a load really holds, over the fixture families.

use std::path::{Path, PathBuf};

use candle_core::Device;

use super::*;
use crate::engine::load::load_model;

fn fixture(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("__test__/fixtures").join(p)
}

fn opts(quantize: Option<&str>) -> LoadOptions {
    LoadOptions { device: Some("cpu".into()), quantize: quantize.map(Into::into), ..Default::default() }
}

#[test]
fn the_weights_estimate_is_what_the_load_holds() {
    let cases = [
        ("qwen3-tiny", None),
        ("qwen3-tiny", Some("q8_0")),
        ("qwen3-tiny", Some("q4_0")),
        ("qwen3-tiny", Some("q4_k")),
        ("qwen3-tiny/model-q8_0.gguf", None),
        ("qwen3-untied-mqa", Some("q8_0")),
        ("gemma3-tiny", None),
        ("lfm2-tiny", None),
        ("qwen35-tiny", Some("q8_0")),
        ("qwen3moe-tiny", None),
        ("gemma4-tiny", None),
        ("gemma3-gguf-tiny/model-f32.gguf", Some("q4_k")),
    ];
    for (path, quantize) in cases {
        let o = opts(quantize);
        let est = estimate(&fixture(path), &o).unwrap();
        let loaded = load_model(&fixture(path), &o, &Device::Cpu, &|_, _| {}).unwrap();
        let (want, mapped) = (loaded.model.weight_bytes() as u64, loaded.model.mapped_bytes() as u64);
        // Exact but for small tensors a family keeps outside its modules (Gemma 4's layer
        // scalars, read as numbers): within 0.5%.
        let off = est.weights.bytes.abs_diff(want);
        assert!(
            off <= want / 200,
            "{path} {quantize:?}: {} estimated, {want} loaded ({:?})",
            est.weights.bytes,
            est.weights.formats
        );
        if !path.starts_with("gemma4") {
            assert_eq!(off, 0, "{path} {quantize:?}");
        }
        // Mapped bytes are a note, not a bound: small matrices read as tensors (a MoE router)
        // are copied though the file holds them in the model's dtype.
        assert!(
            est.weights.mapped_bytes.abs_diff(mapped) <= want / 100,
            "{path}: {} mapped, {mapped} in the load",
            est.weights.mapped_bytes
        );
        assert_eq!(est.context_length, loaded.model.max_positions(), "{path}");
        let layout = loaded.model.kv_layout();
        let cfg = &loaded.model.cfg;
        for (name, bpt) in &est.kv_bytes_per_token {
            let f = crate::kv::sizing::kv_dtype(Some(name), loaded.model.dtype).unwrap();
            assert_eq!(*bpt, layout.pool_bytes_per_token(cfg.num_kv_heads, cfg.head_dim, f) as u64, "{path} {name}");
        }
        assert_eq!(est.state_bytes_per_sequence, layout.state_bytes_per_sequence() as u64, "{path}");
    }
}

#[test]
fn auto_picks_the_longest_context_the_budget_holds() {
    let path = fixture("qwen3-tiny");
    // YaRN stretches its 512 positions to 4,096.
    let yarn = serde_json::json!({ "type": "yarn", "factor": 8, "originalMaxPositionEmbeddings": 512 });
    let base = LoadOptions { rope_scaling: Some(yarn), ..opts(None) };
    let full = estimate(&path, &base).unwrap();
    assert_eq!(full.model_context_length, 4096);
    let bpt = full.kv_bytes_per_token.iter().find(|(n, _)| *n == "f32").unwrap().1;
    assert_eq!(full.kv_dtype, "f32");
    // Room for 1,000 positions next to the rest: 992 (whole blocks of 16) for 'auto'.
    let fixed = full.weights.bytes + full.rope_bytes + full.scratch_bytes + full.tokenizer_bytes;
    let budget = fixed + 1000 * bpt;
    let auto = LoadOptions { context_auto: true, memory_limit: Some(budget), ..base.clone() };
    let est = estimate(&path, &auto).unwrap();
    assert_eq!((est.fit_context_length, est.context_length), (992, 992));
    assert!(!est.memory_limit_is_default && est.total_bytes <= budget);
    let loaded = load_model(&path, &auto, &Device::Cpu, &|_, _| {}).unwrap();
    assert_eq!(loaded.model.max_positions(), 992);
    assert_eq!(loaded.kv_room, Some(budget - fixed));
    // A model's own context caps it.
    let roomy = LoadOptions { memory_limit: Some(u64::MAX / 2), ..auto.clone() };
    assert_eq!(estimate(&path, &roomy).unwrap().context_length, full.model_context_length);
    // Fewer than MIN_AUTO_CONTEXT positions, or not the weights: out of memory, before any
    // weight is read.
    // The estimate says so; the load refuses.
    let tight = LoadOptions { memory_limit: Some(fixed + 100 * bpt), ..auto.clone() };
    let est = estimate(&path, &tight).unwrap();
    assert_eq!(est.fit_context_length, 96);
    assert!(est.does_not_fit.as_deref().unwrap().contains("96 positions fit"), "{:?}", est.does_not_fit);
    assert!(estimate(&path, &auto).unwrap().does_not_fit.is_none());
    assert_eq!(load_model(&path, &tight, &Device::Cpu, &|_, _| {}).err().unwrap().code(), "OUT_OF_MEMORY");
    let tiny = LoadOptions { memory_limit: Some(1000), ..base };
    assert!(estimate(&path, &tiny).unwrap().does_not_fit.unwrap().contains("memoryLimit 1000"));
    let e = load_model(&path, &tiny, &Device::Cpu, &|_, _| {}).err().unwrap();
    assert_eq!(e.code(), "OUT_OF_MEMORY");
    assert!(e.to_string().contains("memoryLimit 1000"), "{e}");
    // Without a limit the default is what the machine has free, less the margin.
    assert!(full.memory_limit_is_default && full.memory_limit > 0);
}

#[test]
fn states_and_dtypes_are_counted() {
    // lfm2-tiny keeps a recurrent state per sequence: slots for 32 sequences and 8 snapshots.
    let est = estimate(&fixture("lfm2-tiny"), &opts(None)).unwrap();
    assert!(est.state_bytes_per_sequence > 0);
    assert_eq!(est.state_slots, 40);
    assert_eq!(est.state_bytes, 40 * est.state_bytes_per_sequence);
    let q8 =
        LoadOptions { kv_cache: crate::kv::KvCacheOptions { dtype: Some("q8_0".into()), ..Default::default() }, ..opts(None) };
    let est = estimate(&fixture("qwen3-tiny"), &q8).unwrap();
    assert_eq!(est.kv_dtype, "q8_0");
    let by = |n: &str| est.kv_bytes_per_token.iter().find(|(d, _)| *d == n).unwrap().1;
    // 3 layers, 2 KV heads of 32: K and V rows of 64 values per layer.
    assert_eq!(by("f32"), 3 * 2 * 64 * 4);
    assert_eq!(by("f16"), 3 * 2 * 64 * 2);
    assert_eq!(by("q8_0"), 3 * 2 * 2 * 34);
    assert_eq!(est.kv_bytes, est.context_length as u64 * by("q8_0"));
    // Options a load refuses are refused here too.
    let bad = LoadOptions { quantize: Some("q3".into()), ..opts(None) };
    assert_eq!(estimate(&fixture("qwen3-tiny"), &bad).unwrap_err().code(), "INVALID_ARGUMENT");
    assert_eq!(estimate(&fixture("missing"), &opts(None)).unwrap_err().code(), "MODEL_NOT_FOUND");
}
