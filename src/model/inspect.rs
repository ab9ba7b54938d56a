//! What a model's files say about it, read without loading its weights: the configuration
//! ([`loader::open`] reads only `config.json` or the GGUF header), and the tensors' storage
//! formats, element counts and sizes from the safetensors headers or the GGUF tensor infos.
//!
//! Every number comes from an untrusted file and passes the checks a load applies before it
//! is used: the config bounds ([`ModelConfig`]), candle's GGUF header limits, the safetensors
//! header validation (every tensor inside the file), and [`gguf_tensor_extent`] (a truncated
//! GGUF is an error here too, not a summary of tensors the file does not hold).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::Device;

use super::config::ModelConfig;
use super::loader::{self, gguf_tensor_bytes, gguf_tensor_extent, ModelFormat, WeightPolicy};
use super::quantize::format_name;
use crate::error::{EngineError, Result};
use crate::files;

/// The tensors stored in one format (`f32`, `bf16`, `q4_1`, …).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorFormat {
    pub format: String,
    pub tensors: usize,
    /// Elements of those tensors.
    pub parameters: u64,
    /// Bytes they take in the files.
    pub bytes: u64,
}

/// The weight files of a model or an adapter.
#[derive(Clone, Debug)]
pub struct WeightsSummary {
    /// `gguf` or `safetensors`.
    pub container: &'static str,
    pub files: usize,
    /// Size of the weight files.
    pub file_bytes: u64,
    pub tensors: usize,
    /// Elements of every tensor (a tied embedding counts once: it is stored once).
    pub parameters: u64,
    /// Most bytes first.
    pub formats: Vec<TensorFormat>,
}

/// A model's configuration and weight files, and where it came from.
pub struct ModelSummary<'a> {
    pub config: ModelConfig,
    pub weights: WeightsSummary,
    /// The opened files: an HF directory (tokenizer files beside) or the GGUF header.
    pub format: ModelFormat<'a>,
}

/// Tensors tallied by format.
#[derive(Default)]
struct Tally(BTreeMap<String, TensorFormat>);

impl Tally {
    fn add(&mut self, format: String, parameters: u64, bytes: u64) {
        let f = self.0.entry(format.clone()).or_insert(TensorFormat { format, tensors: 0, parameters: 0, bytes: 0 });
        f.tensors += 1;
        f.parameters = f.parameters.saturating_add(parameters);
        f.bytes = f.bytes.saturating_add(bytes);
    }

    fn finish(self, container: &'static str, files: usize, file_bytes: u64) -> WeightsSummary {
        let mut formats: Vec<TensorFormat> = self.0.into_values().collect();
        formats.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.format.cmp(&b.format)));
        WeightsSummary {
            container,
            files,
            file_bytes,
            tensors: formats.iter().map(|f| f.tensors).sum(),
            parameters: formats.iter().fold(0u64, |n, f| n.saturating_add(f.parameters)),
            formats,
        }
    }
}

/// Elements of a tensor of `dims`; `None` when the count overflows.
fn elements(dims: &[usize]) -> Option<u64> {
    dims.iter().try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?))
}

/// The tensors of safetensors `files`, from their headers only: the files are memory-mapped
/// and `safetensors` validates each header (size, JSON, every tensor's byte range inside the
/// file) without touching the tensor data. Errors are messages naming the file.
pub fn safetensors_summary(paths: &[PathBuf]) -> std::result::Result<WeightsSummary, String> {
    let mut tally = Tally::default();
    let mut file_bytes = 0u64;
    for p in paths {
        let len = files::regular_file_len(p).map_err(|e| format!("{}: {e}", p.display()))?;
        file_bytes = file_bytes.saturating_add(len);
        let file = std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
        // SAFETY: mapped read-only for the duration of this call; `read_metadata` checks the
        // header against the map's length before reading it, and no tensor data is read.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("{}: {e}", p.display()))?;
        let (_, metadata) = safetensors::SafeTensors::read_metadata(&map).map_err(|e| format!("{}: {e}", p.display()))?;
        for info in metadata.tensors().values() {
            let n = elements(&info.shape)
                .ok_or_else(|| format!("{}: a tensor's shape {:?} is too large", p.display(), info.shape))?;
            let bytes = info.data_offsets.1.saturating_sub(info.data_offsets.0) as u64;
            tally.add(format!("{:?}", info.dtype).to_lowercase(), n, bytes);
        }
    }
    Ok(tally.finish("safetensors", paths.len(), file_bytes))
}

/// The tensors a GGUF header declares, each checked to lie inside the file.
fn gguf_summary(src: &loader::GgufSource) -> Result<WeightsSummary> {
    let content = src.content();
    let mut tally = Tally::default();
    for (name, info) in &content.tensor_infos {
        let (_, bytes) = gguf_tensor_extent(content, name, src.file_len())?;
        // `gguf_tensor_extent` checked the byte count, so the element count does not overflow.
        let n = elements(info.shape.dims()).filter(|_| gguf_tensor_bytes(info).is_some()).unwrap_or(0);
        tally.add(format_name(info.ggml_dtype), n, bytes);
    }
    Ok(tally.finish("gguf", 1, src.file_len()))
}

/// Reads `path` (an HF model directory or a GGUF file) as a load would, up to the weights,
/// which are summarised from the headers instead of read.
pub fn summarize(path: &Path) -> Result<ModelSummary<'static>> {
    fn no_progress(_: u64, _: u64) {}
    let files = loader::open(path, &Device::Cpu, &no_progress, WeightPolicy::default())?;
    let weights = match &files.format {
        ModelFormat::HfDir(dir) => safetensors_summary(&loader::safetensors_files(dir)?).map_err(EngineError::InvalidModel)?,
        ModelFormat::Gguf(src) => gguf_summary(src)?,
    };
    Ok(ModelSummary { config: files.config, weights, format: files.format })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(p: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("__test__/fixtures").join(p)
    }

    #[test]
    fn summaries_of_the_fixture_files_agree_with_their_configs() {
        // qwen3-tiny: tied, 3 layers, hidden 64, 4 heads of 32 (q: 128 rows), 2 kv heads,
        // ffn 128, vocab 400, q/k norms.
        let (h, layers, q, kv, ffn, vocab, hd) = (64u64, 3u64, 128u64, 64u64, 128u64, 400u64, 32u64);
        let per_layer = h * q + 2 * h * kv + q * h + 3 * h * ffn + 2 * h + 2 * hd;
        let params = vocab * h + layers * per_layer + h;
        let dir = summarize(&fixture("qwen3-tiny")).unwrap();
        assert_eq!(dir.config.num_layers, 3);
        assert_eq!(dir.weights.container, "safetensors");
        assert_eq!(dir.weights.parameters, params);
        assert_eq!(dir.weights.formats.len(), 1);
        assert_eq!(dir.weights.formats[0].format, "f32");
        assert_eq!(dir.weights.formats[0].bytes, params * 4);
        assert_eq!(dir.weights.file_bytes, std::fs::metadata(fixture("qwen3-tiny/model.safetensors")).unwrap().len());

        let gguf = summarize(&fixture("qwen3-tiny/model-q8_0.gguf")).unwrap();
        assert_eq!(gguf.weights.container, "gguf");
        assert_eq!(gguf.weights.parameters, params);
        assert_eq!(gguf.weights.tensors, dir.weights.tensors);
        let names: Vec<&str> = gguf.weights.formats.iter().map(|f| f.format.as_str()).collect();
        assert_eq!(names, ["q8_0", "f32"]);
        // Q8_0: 34 bytes per block of 32.
        assert_eq!(gguf.weights.formats[0].bytes, gguf.weights.formats[0].parameters / 32 * 34);
        assert!(gguf.config.tie_word_embeddings);

        // Sharded: the three files together.
        let sharded = summarize(&fixture("qwen3-untied-mqa")).unwrap();
        assert_eq!(sharded.weights.files, 3);
    }

    #[test]
    fn hostile_files_are_typed_errors() {
        let dir = std::env::temp_dir().join(format!("er-inspect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = std::fs::read(fixture("qwen3-tiny/model-f32.gguf")).unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let mut huge_tensors = good.clone();
        huge_tensors[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let mut long_string = good[..4096].to_vec();
        // The first metadata key's length.
        long_string[24..32].copy_from_slice(&(2u64 << 30).to_le_bytes());
        for (name, bytes) in [
            ("truncated.gguf", &good[..good.len() * 6 / 10]),
            ("header-cut.gguf", &good[..100]),
            ("huge-tensors.gguf", &huge_tensors[..]),
            ("long-string.gguf", &long_string[..]),
            ("empty.gguf", &[][..]),
        ] {
            let e = summarize(&write(name, bytes)).err().unwrap();
            assert_eq!(e.code(), "INVALID_MODEL", "{name}: {e}");
        }
        let model = dir.join("huge");
        std::fs::create_dir_all(&model).unwrap();
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture("qwen3-tiny/config.json")).unwrap()).unwrap();
        cfg["hidden_size"] = (1u64 << 40).into();
        std::fs::write(model.join("config.json"), cfg.to_string()).unwrap();
        assert_eq!(summarize(&model).err().unwrap().code(), "INVALID_MODEL");
        assert_eq!(summarize(&dir.join("missing")).err().unwrap().code(), "MODEL_NOT_FOUND");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
