//! Helpers shared by the integration tests (`crate::common` in each test module).

use std::path::{Path, PathBuf};

use expert_runtime::engine::{load_model, LoadOptions};
use expert_runtime::model::Decoder;
use serde_json::Value;

/// `__test__/fixtures/{name}`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("__test__/fixtures").join(name)
}

/// A JSON file, parsed.
pub fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// The model at `path`, on the CPU.
pub fn load(path: &Path, opts: &LoadOptions) -> Decoder {
    load_model(path, opts, &candle_core::Device::Cpu, &|_, _| {}).unwrap().model
}

pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let lse = logits.iter().map(|&x| ((x - max) as f64).exp()).sum::<f64>().ln() as f32 + max;
    logits.iter().map(|&x| x - lse).collect()
}

/// The greedy pick: the index of the largest value, ties to the lower index.
pub fn argmax(lp: &[f32]) -> u32 {
    (0..lp.len()).max_by(|&a, &b| lp[a].partial_cmp(&lp[b]).unwrap().then(b.cmp(&a))).unwrap() as u32
}

/// `model`'s own greedy decode of `n` tokens after `prompt` (each step fed its own pick), from a
/// fresh cache: what a GGUF's decode is compared with llama.cpp's by.
pub fn greedy_decode(model: &Decoder, prompt: &[u32], n: usize) -> Vec<u32> {
    greedy_decode_in(model, prompt, n, 64)
}

/// [`greedy_decode`] in a cache of `max_len` positions.
pub fn greedy_decode_in(model: &Decoder, prompt: &[u32], n: usize, max_len: usize) -> Vec<u32> {
    let mut cache = model.new_cache(max_len).unwrap();
    let mut input = prompt.to_vec();
    let mut tokens = Vec::with_capacity(n);
    for _ in 0..n {
        let logits = model.forward(&input, &mut cache, expert_runtime::model::decoder::Logits::Last).unwrap();
        tokens.push(argmax(&log_softmax(&logits.to_vec1::<f32>().unwrap())));
        input = vec![*tokens.last().unwrap()];
    }
    tokens
}
