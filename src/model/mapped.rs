//! Zero-copy dense weights: a `[n, k]` matrix read in place from a memory-mapped safetensors
//! file, when the file stores it in the dtype the model runs (f32, or f16) on the CPU.
//!
//! - **Why.** Copying a 2.4 GB f32 model into fresh memory costs its size in RSS on top of the
//!   page cache, and seconds of load. Read in place, the load is parsing and validation; pages
//!   come in from the page cache as the first forward pass touches them, and the kernel may
//!   share them between processes that load the same file.
//! - **Kernels.** candle's CPU tensors own their memory, so a mapped matrix runs through the
//!   `gemm` crate directly, with the strides candle's own matmul uses for `x · wᵀ` (the same
//!   library and arithmetic as [`super::linear::Weight::Dense`]). A single row over a large
//!   matrix (decode) is split by output rows across the thread pool, as the dense path does.
//! - **Safety.** The map is private and read-only and held by every matrix cut from it (an
//!   `Arc`), so it outlives its readers. The slice's bounds were checked against the map and
//!   its alignment against the element type at construction. A file truncated on disk while a
//!   model maps it faults on the next read of a lost page (SIGBUS), as with every mmap-based
//!   loader: replace model files by writing a new file and renaming it over the old one (the
//!   map keeps the old inode alive), or load with `mmap: false` to copy the weights.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use half::f16;
use memmap2::Mmap;
use rayon::prelude::*;

use super::linear::{gemv_chunk_rows, PARALLEL_GEMV_ELEMS};
use crate::error::{EngineError, Result};

/// A dense matrix inside a memory map.
pub struct Mapped {
    map: Arc<Mmap>,
    offset: usize,
    n: usize,
    k: usize,
    dtype: DType,
}

impl Mapped {
    /// `[n, k]` of `dtype` (f32 or f16) at `offset` in `map`; `None` when the range is out of
    /// the map, misaligned for the element type, or the dtype has no kernel here.
    pub fn new(map: Arc<Mmap>, offset: usize, n: usize, k: usize, dtype: DType) -> Option<Self> {
        let size = match dtype {
            DType::F32 => 4,
            DType::F16 => 2,
            _ => return None,
        };
        let end = n.checked_mul(k)?.checked_mul(size)?.checked_add(offset)?;
        let aligned = (map.as_ptr() as usize).checked_add(offset)?.is_multiple_of(size);
        (n > 0 && k > 0 && end <= map.len() && aligned).then_some(Self { map, offset, n, k, dtype })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// `(n, k)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The elements, row-major, as `T` (which must be the matrix dtype).
    pub fn values<T: Element>(&self) -> Result<&[T]> {
        if self.dtype != T::DTYPE {
            return Err(EngineError::Internal(format!("a {:?} mapped matrix read as {:?}", self.dtype, T::DTYPE)));
        }
        Ok(self.slice::<T>())
    }

    pub fn size_in_bytes(&self) -> usize {
        self.n * self.k * self.dtype.size_in_bytes()
    }

    fn slice<T: Element>(&self) -> &[T] {
        assert_eq!(T::DTYPE, self.dtype);
        // SAFETY: `new` checked that `n · k` elements of this size lie inside the map from
        // `offset` and that the start is aligned for the type; the map lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(self.offset) as *const T, self.n * self.k) }
    }

    /// `x [rows, k]` → `x · wᵀ [rows, n]` in the matrix dtype (`x` is cast to it).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.dtype {
            DType::F32 => self.forward_as::<f32>(x),
            _ => self.forward_as::<f16>(x),
        }
    }

    fn forward_as<T: Element>(&self, x: &Tensor) -> Result<Tensor> {
        let rows = x.dim(0)?;
        if x.dim(1)? != self.k {
            return Err(EngineError::Internal(format!("a [{rows}, {}] input to a [{}, {}] weight", x.dim(1)?, self.n, self.k)));
        }
        let x = x.to_dtype(self.dtype)?.contiguous()?;
        let (storage, layout) = x.storage_and_layout();
        let candle_core::Storage::Cpu(cpu) = &*storage else {
            return Err(EngineError::Internal("a mapped weight needs CPU activations".into()));
        };
        let xs = &T::cpu_slice(cpu)?[layout.start_offset()..][..rows * self.k];
        let w = self.slice::<T>();
        let mut out = vec![T::ZERO; rows * self.n];
        if rows == 1 && self.n * self.k >= PARALLEL_GEMV_ELEMS {
            let chunk = gemv_chunk_rows(self.n);
            out.par_chunks_mut(chunk).enumerate().for_each(|(i, o)| {
                let w = &w[i * chunk * self.k..][..o.len() * self.k];
                matmul_t(xs, 1, w, o.len(), self.k, o, gemm::Parallelism::None);
            });
        } else {
            matmul_t(xs, rows, w, self.n, self.k, &mut out, pool_parallelism());
        }
        drop(storage);
        Ok(Tensor::from_vec(out, (rows, self.n), &Device::Cpu)?)
    }

    /// Rows `ids` of the matrix (an embedding lookup): `[ids.., k]` in the matrix dtype.
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        match self.dtype {
            DType::F32 => self.embedding_as::<f32>(ids),
            _ => self.embedding_as::<f16>(ids),
        }
    }

    fn embedding_as<T: Element>(&self, ids: &Tensor) -> Result<Tensor> {
        let list: Vec<u32> = ids.flatten_all()?.to_dtype(DType::U32)?.to_vec1()?;
        let w = self.slice::<T>();
        let mut out = Vec::with_capacity(list.len() * self.k);
        for &id in &list {
            let r = id as usize;
            if r >= self.n {
                return Err(EngineError::InvalidArgument(format!(
                    "token id {id} out of range for an embedding of {} rows",
                    self.n
                )));
            }
            out.extend_from_slice(&w[r * self.k..(r + 1) * self.k]);
        }
        let mut dims = ids.dims().to_vec();
        dims.push(self.k);
        Ok(Tensor::from_vec(out, dims, &Device::Cpu)?)
    }

    /// The whole matrix copied into a tensor (adapters that read the base weight once).
    pub fn to_tensor(&self) -> Result<Tensor> {
        Ok(match self.dtype {
            DType::F32 => Tensor::from_slice(self.slice::<f32>(), (self.n, self.k), &Device::Cpu)?,
            _ => Tensor::from_slice(self.slice::<f16>(), (self.n, self.k), &Device::Cpu)?,
        })
    }
}

/// `out [m, n] = x [m, k] · w [n, k]ᵀ`, all row-major (the strides of candle's `x.matmul(w.t())`).
fn matmul_t<T: Element>(x: &[T], m: usize, w: &[T], n: usize, k: usize, out: &mut [T], par: gemm::Parallelism) {
    gemm_t(x, m, w, n, k, out, None, par)
}

/// `out [m, n] += scale · x [m, k] · w [n, k]ᵀ`, all row-major, split across the thread pool.
pub fn matmul_t_add(x: &[f32], m: usize, w: &[f32], n: usize, k: usize, out: &mut [f32], scale: f32) {
    gemm_t(x, m, w, n, k, out, Some(scale), pool_parallelism())
}

/// `gemm`'s parallelism over the current thread pool.
pub fn pool_parallelism() -> gemm::Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => gemm::Parallelism::None,
        threads => gemm::Parallelism::Rayon(threads),
    }
}

/// `out = x · wᵀ`, or with `add = Some(s)` `out += s · x · wᵀ`.
#[allow(clippy::too_many_arguments)]
fn gemm_t<T: Element>(x: &[T], m: usize, w: &[T], n: usize, k: usize, out: &mut [T], add: Option<T>, par: gemm::Parallelism) {
    assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    let (read_dst, scale) = match add {
        Some(s) => (true, s),
        None => (false, T::ONE),
    };
    // SAFETY: the asserts above bound every index gemm reads or writes with these strides.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            read_dst,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            T::ONE,
            scale,
            false,
            false,
            false,
            par,
        )
    }
}

/// The element types a mapped matrix runs in.
pub trait Element: Copy + Send + Sync + candle_core::WithDType + 'static {
    const ZERO: Self;
    const ONE: Self;
    fn cpu_slice(s: &candle_core::CpuStorage) -> Result<&[Self]>;
}

impl Element for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn cpu_slice(s: &candle_core::CpuStorage) -> Result<&[Self]> {
        Ok(s.as_slice::<f32>()?)
    }
}

impl Element for f16 {
    const ZERO: Self = f16::ZERO;
    const ONE: Self = f16::ONE;
    fn cpu_slice(s: &candle_core::CpuStorage) -> Result<&[Self]> {
        Ok(s.as_slice::<f16>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A map of `data` (f32) behind `pad` bytes, through a temporary file.
    fn map_of(data: &[f32], pad: usize) -> Arc<Mmap> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("expert-runtime-mapped-{}-{n}", std::process::id()));
        let mut f = std::fs::File::options().read(true).write(true).create_new(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f.write_all(&vec![0u8; pad]).unwrap();
        for v in data {
            f.write_all(&v.to_le_bytes()).unwrap();
        }
        // SAFETY: a private temporary file nobody else writes.
        Arc::new(unsafe { Mmap::map(&f) }.unwrap())
    }

    #[test]
    fn mapped_products_equal_the_dense_ones() {
        let dev = Device::Cpu;
        // 2051 × 600: a decode row is split across threads; 3 rows are one gemm.
        let (n, k) = (2051, 600);
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let wv: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
        let m = Mapped::new(map_of(&wv, 64), 64, n, k, DType::F32).unwrap();
        assert_eq!(m.size_in_bytes(), n * k * 4);
        for rows in [1, 3, 40] {
            let x = Tensor::randn(0f32, 1.0, (rows, k), &dev).unwrap();
            let want: Vec<f32> = x.matmul(&w.t().unwrap()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let got: Vec<f32> = m.forward(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let d = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(d < 1e-4, "{rows} rows: max |Δ| {d}");
        }
        let ids = Tensor::new(&[2050u32, 0, 7], &dev).unwrap();
        let want: Vec<f32> = w.index_select(&ids, 0).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let got: Vec<f32> = m.embedding(&ids).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(got, want);
        assert!(m.embedding(&Tensor::new(&[2051u32], &dev).unwrap()).is_err());
        assert_eq!(m.to_tensor().unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap(), wv);
    }

    #[test]
    fn ranges_outside_the_map_or_misaligned_are_refused() {
        let map = map_of(&[1.0; 16], 2);
        assert!(Mapped::new(map.clone(), 2, 4, 4, DType::F32).is_none(), "misaligned f32");
        assert!(Mapped::new(map.clone(), 2, 4, 4, DType::F16).is_some());
        assert!(Mapped::new(map.clone(), 4, 4, 4, DType::F32).is_none(), "past the end");
        assert!(Mapped::new(map.clone(), 0, usize::MAX, 2, DType::F32).is_none(), "overflow");
        assert!(Mapped::new(map.clone(), 0, 0, 4, DType::F32).is_none(), "empty");
        assert!(Mapped::new(map, 0, 2, 2, DType::BF16).is_none(), "no bf16 kernel");
    }
}
