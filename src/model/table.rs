//! A matrix that is only ever looked up by row: Gemma 4's per-layer input embeddings
//! (`embed_tokens_per_layer`, `[vocab, layers · size]`: 262,144 × 8,960 values in E2B, more
//! than the rest of the model together).
//!
//! A projection runs matrix products, so the loader stores it in the dtype the model computes in
//! (on the CPU, f32). A lookup table needs no kernel: read in place from the memory-mapped
//! safetensors file in whatever float dtype the file holds it (f32, f16 or bf16), each looked-up
//! row converted on the way out (exact: every f16 and bf16 value is an f32). E2B's table then
//! takes no memory of the process's own (its pages are the file's, in the page cache) instead of
//! 9.4 GB as f32, and a token touches 17.5 KB of it (its row). Elsewhere (GGUF, `mmap: false`, a GPU) the table is what the loader makes of any
//! linear weight (dense, or quantized rows from GGUF blocks).

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};
use memmap2::Mmap;

use super::linear::Linear;
use crate::error::{EngineError, Result};

pub enum Table {
    Mapped(MappedRows),
    Linear(Linear),
}

impl Table {
    /// Rows `ids` (`[rows]`): `[rows, k]`, in the table's dtype (the caller casts).
    pub fn rows(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        match self {
            Table::Mapped(m) => Ok(m.rows(ids)?.to_device(device)?),
            Table::Linear(l) => l.embedding(&Tensor::from_slice(ids, ids.len(), device)?),
        }
    }

    /// The linear weight, where the table is one.
    pub fn linear(&self) -> Option<&Linear> {
        match self {
            Table::Linear(l) => Some(l),
            Table::Mapped(_) => None,
        }
    }

    /// Bytes it occupies (a mapped table: the bytes of the file it reads).
    pub fn size_in_bytes(&self) -> usize {
        match self {
            Table::Mapped(m) => m.n * m.k * m.dtype.size_in_bytes(),
            Table::Linear(l) => l.weight.size_in_bytes(),
        }
    }
}

/// `[n, k]` floats inside a memory map.
pub struct MappedRows {
    map: Arc<Mmap>,
    offset: usize,
    n: usize,
    k: usize,
    dtype: DType,
}

impl MappedRows {
    /// `[n, k]` of `dtype` (f32, f16 or bf16) at `offset` in `map`; `None` when the range is out
    /// of the map, misaligned for the element type, empty, or of another dtype.
    pub fn new(map: Arc<Mmap>, offset: usize, n: usize, k: usize, dtype: DType) -> Option<Self> {
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return None;
        }
        let size = dtype.size_in_bytes();
        let end = n.checked_mul(k)?.checked_mul(size)?.checked_add(offset)?;
        let aligned = (map.as_ptr() as usize).checked_add(offset)?.is_multiple_of(size);
        (n > 0 && k > 0 && end <= map.len() && aligned).then_some(Self { map, offset, n, k, dtype })
    }

    fn slice<T>(&self) -> &[T] {
        assert_eq!(std::mem::size_of::<T>(), self.dtype.size_in_bytes());
        // SAFETY: `new` checked that `n · k` elements of this size lie inside the map from
        // `offset` and that the start is aligned for the type; the map lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(self.offset) as *const T, self.n * self.k) }
    }

    /// Rows `ids`, `[ids, k]` in the file's dtype.
    pub fn rows(&self, ids: &[u32]) -> Result<Tensor> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.n) {
            return Err(EngineError::InvalidArgument(format!("token id {id} out of range for a table of {} rows", self.n)));
        }
        fn gather<T: candle_core::WithDType>(w: &[T], ids: &[u32], k: usize) -> Result<Tensor> {
            let mut out = Vec::with_capacity(ids.len() * k);
            for &id in ids {
                out.extend_from_slice(&w[id as usize * k..][..k]);
            }
            Ok(Tensor::from_vec(out, (ids.len(), k), &Device::Cpu)?)
        }
        match self.dtype {
            DType::F32 => gather(self.slice::<f32>(), ids, self.k),
            DType::F16 => gather(self.slice::<f16>(), ids, self.k),
            _ => gather(self.slice::<bf16>(), ids, self.k),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_of(bytes: &[u8]) -> Arc<Mmap> {
        let mut m = memmap2::MmapMut::map_anon(bytes.len()).unwrap();
        m.copy_from_slice(bytes);
        Arc::new(m.make_read_only().unwrap())
    }

    #[test]
    fn rows_of_every_float_dtype_widen_exactly_and_bad_ids_are_errors() {
        let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.75 - 3.0).collect();
        let as_bytes = |dtype: DType| -> Vec<u8> {
            let t = Tensor::from_slice(&values, (3, 4), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
            let mut out = Vec::new();
            t.write_bytes(&mut out).unwrap();
            out
        };
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let table = MappedRows::new(map_of(&as_bytes(dtype)), 0, 3, 4, dtype).unwrap();
            let got: Vec<Vec<f32>> = table.rows(&[2, 0, 2]).unwrap().to_dtype(DType::F32).unwrap().to_vec2().unwrap();
            assert_eq!(got, vec![values[8..12].to_vec(), values[0..4].to_vec(), values[8..12].to_vec()], "{dtype:?}");
            let e = table.rows(&[3]).unwrap_err();
            assert_eq!(e.code(), "INVALID_ARGUMENT", "{e}");
        }
        let map = map_of(&as_bytes(DType::F32));
        assert!(MappedRows::new(map.clone(), 4, 3, 4, DType::F32).is_none(), "past the end");
        assert!(MappedRows::new(map.clone(), 2, 2, 4, DType::F32).is_none(), "misaligned");
        assert!(MappedRows::new(map.clone(), 0, usize::MAX, 4, DType::F32).is_none(), "overflow");
        assert!(MappedRows::new(map.clone(), 0, 0, 4, DType::F32).is_none(), "empty");
        assert!(MappedRows::new(map, 0, 3, 4, DType::U8).is_none(), "not a float");
    }
}
