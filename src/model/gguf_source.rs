//! Weights from a GGUF file: the header (metadata and tensor infos, read with candle's reader
//! under our limits), each tensor's extent checked against the file before it is read, and
//! the [`WeightSource`] that reads tensors by their HF names ([`gguf_name`]): block matrices our
//! CPU kernels run go from the file's bytes straight into the packed layouts, the rest through
//! candle's `QTensor`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;

use candle_core::quantized::{gguf_file, QTensor};
use candle_core::{DType, Device, Tensor};

use super::gguf_names::{gguf_name, GgufStyle};
use super::linear::{Linear, Weight};
use super::loader::{check_stack, split_linears, Progress, WeightPolicy, WeightSource};
use super::quantize::{self, DenseType, Role};
use crate::error::{EngineError, Result};
use crate::files;

const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// True when the file starts with the GGUF magic.
pub fn is_gguf(path: &Path) -> bool {
    let mut m = [0u8; 4];
    // Never open a pipe or a device: opening a FIFO blocks until someone writes to it.
    files::regular_file_len(path).is_ok()
        && File::open(path).and_then(|mut f| f.read_exact(&mut m)).map(|_| m == GGUF_MAGIC).unwrap_or(false)
}

/// Reads a GGUF header (metadata and tensor infos); `origin` names the file in errors.
///
/// candle's reader panics on some malformed headers (a `general.alignment` of 0 divides by
/// zero): that is an invalid file like any other, not an internal error.
pub fn read_gguf_header<R: Read + Seek>(reader: &mut R, origin: &str) -> Result<gguf_file::Content> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| gguf_file::Content::read(reader)))
        .map_err(|p| EngineError::InvalidModel(format!("GGUF header of {origin}: {}", crate::error::panic_message(&*p))))?
        .map_err(|e| EngineError::invalid_model(format!("GGUF header of {origin}"), e))
}

/// Bytes of a GGUF tensor's data; `None` when its element count overflows or is not a whole
/// number of its type's blocks. (The dimensions come from the file: candle's
/// `Shape::elem_count` would overflow on them.)
pub fn gguf_tensor_bytes(info: &gguf_file::TensorInfo) -> Option<u64> {
    let elems = info.shape.dims().iter().try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?))?;
    let block = info.ggml_dtype.block_size() as u64;
    if !elems.is_multiple_of(block) {
        return None;
    }
    (elems / block).checked_mul(info.ggml_dtype.type_size() as u64)
}

/// `(start, bytes)` of tensor `name`'s data in a GGUF file of `file_len` bytes, checked to lie
/// inside the file (a truncated download must fail cleanly, not read past the end) and to be
/// nonempty (candle reads an empty tensor through a misaligned pointer; no model has one).
pub fn gguf_tensor_extent(content: &gguf_file::Content, name: &str, file_len: u64) -> Result<(u64, u64)> {
    let info = content.tensor_infos.get(name).ok_or_else(|| EngineError::InvalidModel(format!("tensor {name} is missing")))?;
    let bytes = gguf_tensor_bytes(info).filter(|&b| b > 0).ok_or_else(|| {
        EngineError::InvalidModel(format!(
            "tensor {name}: shape {:?} is empty, not a whole number of {:?} blocks or too large",
            info.shape.dims(),
            info.ggml_dtype
        ))
    })?;
    match content.tensor_data_offset.checked_add(info.offset).and_then(|start| start.checked_add(bytes)) {
        Some(end) if end <= file_len => Ok((end - bytes, bytes)),
        end => Err(EngineError::InvalidModel(format!(
            "tensor {name} ends at byte {} but the file has {file_len} bytes (truncated?)",
            end.map_or_else(|| "past 2^64".to_string(), |e| e.to_string())
        ))),
    }
}

pub struct GgufSource<'a> {
    content: gguf_file::Content,
    reader: BufReader<File>,
    device: Device,
    file_len: u64,
    loaded: u64,
    total: u64,
    progress: Option<Progress<'a>>,
    policy: WeightPolicy,
    /// How the file's family names its tensors (`general.architecture`).
    style: GgufStyle,
}

impl<'a> GgufSource<'a> {
    pub fn open(path: &Path, device: &Device, progress: Option<Progress<'a>>) -> Result<Self> {
        files::regular_file_len(path).map_err(|e| EngineError::invalid_model(path.display(), e))?;
        let file = File::open(path).map_err(|e| EngineError::invalid_model(path.display(), e))?;
        let file_len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut reader = BufReader::new(file);
        if !is_gguf(path) {
            return Err(EngineError::InvalidModel(format!("{} is not a GGUF file (bad magic)", path.display())));
        }
        let content = read_gguf_header(&mut reader, &path.display().to_string())?;
        // For progress only: a tensor whose size does not compute fails when it is read.
        let total = content.tensor_infos.values().filter_map(gguf_tensor_bytes).fold(0, u64::saturating_add);
        let style = match content.metadata.get("general.architecture") {
            Some(gguf_file::Value::String(a)) => GgufStyle::of(a),
            _ => GgufStyle::Plain,
        };
        Ok(Self {
            style,
            content,
            reader,
            device: device.clone(),
            file_len,
            loaded: 0,
            total,
            progress,
            policy: WeightPolicy::default(),
        })
    }

    /// How weights are stored (`dequantize`, `quantize`; GGUF tensors are always copied).
    pub fn policy(mut self, policy: WeightPolicy) -> Self {
        self.policy = policy;
        self
    }

    pub fn metadata(&self) -> &HashMap<String, gguf_file::Value> {
        &self.content.metadata
    }

    /// The header as read: metadata and tensor infos (shapes, types and offsets as the file
    /// declares them, unchecked: see [`gguf_tensor_extent`]).
    pub fn content(&self) -> &gguf_file::Content {
        &self.content
    }

    /// The file's size in bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Reads a tensor, checking its shape and that its bytes lie inside the file (a
    /// truncated download must fail cleanly, not read past the end).
    fn read(&mut self, name: &str, shape: &[usize]) -> Result<QTensor> {
        let device = self.device.clone();
        self.read_onto(name, shape, &device)
    }

    /// Tensor `wname` of `shape` (its last dimension the input size), read on the host and cut
    /// into the consecutive row blocks `parts`, each stored as linear `name` would be (quantized
    /// as the file has it, or by the load policy) and moved to the device.
    fn cut_rows(&mut self, wname: &str, shape: &[usize], parts: &[(&str, usize)], dtype: DType) -> Result<Vec<Result<Weight>>> {
        let (&inp, lead) = shape.split_last().ok_or_else(|| EngineError::Internal(format!("{wname}: no shape")))?;
        let total: usize = lead.iter().product();
        let q = self.read_onto(wname, shape, &Device::Cpu)?;
        let ggml = q.dtype();
        let dense = DenseType::of_ggml(ggml);
        let data = q.data()?;
        // A row is a whole number of blocks (the reader checked the tensor is).
        let row_bytes = data.len() / total.max(1);
        let mut weights = Vec::with_capacity(parts.len());
        let mut row = 0;
        for &(name, rows) in parts {
            let bytes = &data[row * row_bytes..(row + rows) * row_bytes];
            row += rows;
            let w = match (dense, self.policy.quantize.format(Role::of(name), inp)) {
                (Some(dense), Some(format)) => quantize::quantize_bytes(bytes, dense, (rows, inp), format, wname, &self.device),
                _ => candle_core::quantized::ggml_file::qtensor_from_ggml(ggml, bytes, vec![rows, inp], &Device::Cpu)
                    .map_err(|e| EngineError::invalid_model(format!("tensor {wname}"), e))
                    .and_then(|part| {
                        if self.policy.dequantize || dense.is_some() {
                            Ok(Weight::Dense(part.dequantize(&self.device)?.to_dtype(dtype)?))
                        } else {
                            Weight::from_qtensor(part, &self.device)
                        }
                    }),
            };
            weights.push(w);
        }
        Ok(weights)
    }

    /// Tensor `name`'s type and `(start, bytes)` in the file, its declared shape checked to be
    /// `shape` and its extent to lie inside the file.
    fn checked(&self, name: &str, shape: &[usize]) -> Result<(candle_core::quantized::GgmlDType, u64, u64)> {
        let info =
            self.content.tensor_infos.get(name).ok_or_else(|| EngineError::InvalidModel(format!("tensor {name} is missing")))?;
        if info.shape.dims() != shape {
            return Err(EngineError::InvalidModel(format!(
                "tensor {name} has shape {:?}, expected {shape:?}",
                info.shape.dims()
            )));
        }
        let (start, bytes) = gguf_tensor_extent(&self.content, name, self.file_len)?;
        Ok((info.ggml_dtype, start, bytes))
    }

    /// Counts `bytes` as read and reports the progress.
    fn advance(&mut self, bytes: u64) {
        self.loaded += bytes;
        if let Some(p) = self.progress {
            p(self.loaded, self.total);
        }
    }

    /// Tensor `name`'s type and bytes as the file stores them, checked as [`Self::read_onto`]
    /// checks them, read without zero-filling first.
    fn read_bytes(&mut self, name: &str, shape: &[usize]) -> Result<(candle_core::quantized::GgmlDType, Vec<u8>)> {
        let (dtype, start, bytes) = self.checked(name, shape)?;
        let len = usize::try_from(bytes).map_err(|_| EngineError::OutOfMemory(format!("tensor {name} has {bytes} bytes")))?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(len)
            .map_err(|_| EngineError::OutOfMemory(format!("cannot allocate tensor {name} ({bytes} bytes)")))?;
        let read = |e: std::io::Error| EngineError::invalid_model(format!("tensor {name}"), e);
        self.reader.seek(std::io::SeekFrom::Start(start)).map_err(read)?;
        (&mut self.reader).take(bytes).read_to_end(&mut buf).map_err(read)?;
        if buf.len() != len {
            return Err(EngineError::InvalidModel(format!(
                "tensor {name}: the file ended after {} of its {bytes} bytes",
                buf.len()
            )));
        }
        self.advance(bytes);
        Ok((dtype, buf))
    }

    fn read_onto(&mut self, name: &str, shape: &[usize], device: &Device) -> Result<QTensor> {
        let (_, _, bytes) = self.checked(name, shape)?;
        let q = self
            .content
            .tensor(&mut self.reader, name, device)
            .map_err(|e| EngineError::invalid_model(format!("tensor {name}"), e))?;
        self.advance(bytes);
        Ok(q)
    }
}

impl WeightSource for GgufSource<'_> {
    fn tensor(&mut self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let g = gguf_name(name.trim_end_matches(".weight").trim_end_matches(".bias"), self.style);
        let suffix = if name.ends_with(".bias") { "bias" } else { "weight" };
        // (Gemma 4's router scales are named `….scale` in full, Qwen3.5's `ssm_dt.bias` and
        // `ssm_a` too.)
        let whole = g.ends_with(".scale") || g.ends_with(".bias") || g.ends_with(".ssm_a");
        let full = if whole { g } else { format!("{g}.{suffix}") };
        // llama.cpp's converter drops a convolution weight's unit dimension (`[c, 1, k]`).
        let squeezed: Vec<usize> = shape.iter().copied().filter(|&d| d != 1).collect();
        let stored: Option<Vec<usize>> = self.content.tensor_infos.get(&full).map(|i| i.shape.dims().to_vec());
        let q = match stored {
            Some(dims) if dims != shape && dims == squeezed => self.read(&full, &squeezed)?,
            _ => self.read(&full, shape)?,
        };
        Ok(q.dequantize(&self.device)?.to_dtype(dtype)?.reshape(shape)?)
    }

    fn linear(&mut self, name: &str, out: usize, inp: usize, bias: bool, dtype: DType) -> Result<Linear> {
        let g = gguf_name(name, self.style);
        let wname = format!("{g}.weight");
        let stored = self.content.tensor_infos.get(&wname).map(|i| i.ggml_dtype);
        let dense = stored.and_then(DenseType::of_ggml);
        let weight = match (dense, self.policy.quantize.format(Role::of(name), inp)) {
            (Some(dense), Some(format)) => {
                // Quantized from the bytes as read (on the CPU), then moved to the device.
                let q = self.read_onto(&wname, &[out, inp], &Device::Cpu)?;
                quantize::quantize_bytes(&q.data()?, dense, (out, inp), format, &wname, &self.device)?
            }
            // Blocks our CPU kernels run: from the file's bytes into the packed layout.
            (None, _) if !self.policy.dequantize && stored.is_some_and(|t| Weight::packs_from_bytes(t, &self.device)) => {
                let (dtype, bytes) = self.read_bytes(&wname, &[out, inp])?;
                Weight::from_ggml_bytes(dtype, &bytes, out, inp)?
            }
            _ => {
                let q = self.read(&wname, &[out, inp])?;
                if self.policy.dequantize || dense.is_some() {
                    Weight::Dense(q.dequantize(&self.device)?.to_dtype(dtype)?)
                } else {
                    Weight::from_qtensor(q, &self.device)?
                }
            }
        };
        let bias = if bias {
            let b = self.read(&format!("{g}.bias"), &[out])?;
            Some(b.dequantize(&self.device)?.to_dtype(dtype)?)
        } else {
            None
        };
        Ok(Linear { weight, bias, out_features: out, in_features: inp })
    }

    fn linear_parts(
        &mut self,
        fused: &str,
        parts: &[(&str, usize)],
        inp: usize,
        bias: bool,
        dtype: DType,
    ) -> Result<Vec<Linear>> {
        let g = gguf_name(fused, self.style);
        let wname = format!("{g}.weight");
        let total = parts.iter().map(|p| p.1).sum::<usize>();
        let weights = self.cut_rows(&wname, &[total, inp], parts, dtype)?;
        let bias = if bias {
            let b = self.read(&format!("{g}.bias"), &[total])?;
            Some(b.dequantize(&self.device)?.to_dtype(dtype)?)
        } else {
            None
        };
        split_linears(weights, parts, inp, bias)
    }

    fn linear_stack(&mut self, stacked: &str, shape: [usize; 3], parts: &[(&str, usize)], dtype: DType) -> Result<Vec<Linear>> {
        check_stack(stacked, shape, parts)?;
        let wname = format!("{}.weight", gguf_name(stacked, self.style));
        let weights = self.cut_rows(&wname, &shape, parts, dtype)?;
        split_linears(weights, parts, shape[2], None)
    }

    fn contains(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(&format!("{}.weight", gguf_name(name, self.style)))
    }

    fn norms_hold_one_plus(&self) -> bool {
        matches!(self.style, GgufStyle::Gemma | GgufStyle::Qwen35)
    }

    fn decay_as_a(&self) -> bool {
        true
    }
}
