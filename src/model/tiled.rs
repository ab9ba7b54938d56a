//! What the packed matrix kernels ([`super::q8`], [`super::kquant`]) share: the
//! [`PackedMatrix`] interface the linear layer calls, and the thread split. A weight is stored
//! in tiles of 16 output rows; chunks of whole tiles run on rayon (candle's own pool spins on a
//! barrier), each writing its own columns of the output; within a chunk, activation rows go in
//! groups of 64 so a tile's weights stay in cache while the rows stream past. Small products run
//! on the calling thread.
//!
//! A decode-sized product is bound by how fast its weights stream from memory, and the
//! hardware prefetchers alone left our kernels well short of a plain read (one row against the
//! Qwen3-0.6B output head on a 2-core Zen 4: 23–26 GB/s, against 35–55 GB/s for a sum of the
//! same bytes). So the kernels ask, block by block, for the weights [`AHEAD`] bytes further on
//! to be brought into L2 ([`Ahead`]): the same product then ran at 30–37 GB/s. Only a tile's
//! first pass of activation rows asks (later passes find the tile in cache), never past the end
//! of the chunk's tiles.

use std::cell::RefCell;
use std::ops::Range;
use std::thread::LocalKey;

use candle_core::{DType, Tensor};
use rayon::prelude::*;

use crate::error::{EngineError, Result};

/// A `[rows, cols]` weight packed for one of our integer kernels. The provided methods are the
/// same for every format.
pub trait PackedMatrix: Sync {
    fn rows(&self) -> usize;

    fn cols(&self) -> usize;

    /// Row `r` dequantized (candle's `to_float` of the format, bit for bit) into `out` (`len =
    /// cols`).
    fn dequantize_row(&self, r: usize, out: &mut [f32]);

    /// `out[r, i] = Σ_j W[i, j] x[r, j]` for `rows` activation rows (`x`: `[rows, cols]`, `out`:
    /// `[rows, self.rows()]`), on the best kernel path of this CPU. A row's result does not
    /// depend on the other rows.
    fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32]);

    /// The whole matrix dequantized, row-major.
    fn dequantize(&self) -> Vec<f32> {
        let k = self.cols();
        let mut out = vec![0f32; self.rows() * k];
        out.par_chunks_mut(k).enumerate().for_each(|(r, o)| self.dequantize_row(r, o));
        out
    }

    /// Rows `ids` of the weight, dequantized: `[ids.., cols]` in f32.
    fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        let ids_v: Vec<u32> = ids.flatten_all()?.to_dtype(DType::U32)?.to_vec1()?;
        let k = self.cols();
        let mut out = vec![0f32; ids_v.len() * k];
        for (&id, row) in ids_v.iter().zip(out.chunks_exact_mut(k)) {
            if id as usize >= self.rows() {
                return Err(EngineError::InvalidArgument(format!(
                    "token id {id} out of range for an embedding of {} rows",
                    self.rows()
                )));
            }
            self.dequantize_row(id as usize, row);
        }
        let mut dims = ids.dims().to_vec();
        dims.push(k);
        Ok(Tensor::from_vec(out, dims, ids.device())?)
    }

    /// `x [rows, cols]` (any float dtype, CPU) → `[rows, self.rows()]` in `x`'s dtype.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let rows = x.dim(0)?;
        let xf = x.to_dtype(DType::F32)?.contiguous()?;
        let mut out = vec![0f32; rows * self.rows()];
        {
            let (storage, layout) = xf.storage_and_layout();
            let candle_core::Storage::Cpu(cpu) = &*storage else {
                return Err(EngineError::InvalidModel("a packed weight needs a CPU tensor".into()));
            };
            let xs = &cpu.as_slice::<f32>()?[layout.start_offset()..][..rows * self.cols()];
            self.matmul(xs, rows, &mut out);
        }
        Ok(Tensor::from_vec(out, (rows, self.rows()), x.device())?.to_dtype(x.dtype())?)
    }
}

/// Output rows per tile.
pub(super) const TN: usize = 16;
/// How far ahead of its reads a kernel prefetches, into L2 (an eighth of the smallest L2 of an
/// AVX2 CPU, 256 KiB). On a Zen 4: 8 to 16 KiB already helped, 32 to 64 KiB most, 128 KiB
/// less; prefetching into L1 instead was slower than none. The NEON kernels do not ask
/// (unmeasured there).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) const AHEAD: usize = 32 * 1024;

/// The weights a kernel may prefetch: everything below `end` (an address; 0 asks for nothing).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct Ahead {
    end: usize,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl Ahead {
    /// Prefetches nothing.
    pub(super) const NONE: Ahead = Ahead { end: 0 };

    /// Asks for the cache lines that start in `at + AHEAD .. at + AHEAD + bytes` (below the
    /// end) to be brought into L2. A kernel that reads its tiles front to back in steps of
    /// `bytes` calls this once per step, so each line of the chunk is asked for once.
    #[inline(always)]
    pub(super) fn fetch(self, at: *const u8, bytes: usize) {
        prefetch(self.lines(at as usize, bytes))
    }

    /// Part `i` of `parts` of [`Ahead::fetch`] for one block of `bytes` at `block` (a long block
    /// asked for over its loop rather than at once).
    #[inline(always)]
    pub(super) fn fetch_part(self, block: *const u8, bytes: usize, i: usize, parts: usize) {
        prefetch(self.part_lines(block as usize, bytes, i, parts))
    }

    /// What pass `i` over a tile's activation rows asks for: the first streams the tile from
    /// memory and prefetches; the others find the tile in cache and ask for nothing.
    #[inline(always)]
    pub(super) fn for_pass(self, i: usize) -> Ahead {
        if i == 0 {
            self
        } else {
            Ahead::NONE
        }
    }

    /// The addresses of the lines [`Ahead::fetch`] asks for.
    #[inline(always)]
    fn lines(self, at: usize, bytes: usize) -> std::iter::StepBy<Range<usize>> {
        let from = at.saturating_add(AHEAD);
        let to = from.saturating_add(bytes).min(self.end);
        (from.checked_next_multiple_of(64).unwrap_or(usize::MAX)..to).step_by(64)
    }

    /// The addresses of the lines [`Ahead::fetch_part`] asks for.
    #[inline(always)]
    fn part_lines(self, block: usize, bytes: usize, i: usize, parts: usize) -> std::iter::StepBy<Range<usize>> {
        let (lo, hi) = (i * bytes / parts, (i + 1) * bytes / parts);
        self.lines(block.saturating_add(lo), hi - lo)
    }
}

/// Asks for each line (an address) to be brought into L2; nothing off x86-64.
#[inline(always)]
fn prefetch(lines: impl Iterator<Item = usize>) {
    #[cfg(target_arch = "x86_64")]
    for line in lines {
        // SAFETY: a prefetch is a hint: it reads nothing into the program and never faults,
        // whatever the address.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(line as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = lines;
}

/// Activation rows per pass over a tile's weights.
const ROW_GROUP: usize = 64;

/// The bytes of a `[n, k]` matrix in tiles of 16 rows: `k / block` block columns of
/// `block_bytes` each per tile, zeroed, the first tile 64-byte aligned; the only copy of a
/// packed weight.
pub(super) struct Tiles {
    data: Vec<u8>,
    off: usize,
    count: usize,
    tile_bytes: usize,
}

impl Tiles {
    /// `format` names the layout in errors: a shape the blocks do not divide is
    /// `INVALID_MODEL`, a size past the address space or the allocator `OUT_OF_MEMORY`.
    pub(super) fn zeroed(n: usize, k: usize, block: usize, block_bytes: usize, format: &str) -> Result<Self> {
        if n == 0 || k == 0 || !k.is_multiple_of(block) {
            return Err(EngineError::InvalidModel(format!("a [{n}, {k}] matrix cannot be packed as {format}")));
        }
        let too_large = || EngineError::OutOfMemory(format!("a [{n}, {k}] {format} matrix is too large"));
        let tile_bytes = (k / block).checked_mul(block_bytes).ok_or_else(too_large)?;
        let count = n.div_ceil(TN);
        let bytes = count.checked_mul(tile_bytes).and_then(|b| b.checked_add(64)).ok_or_else(too_large)?;
        let mut data = Vec::new();
        data.try_reserve_exact(bytes)
            .map_err(|_| EngineError::OutOfMemory(format!("cannot allocate a [{n}, {k}] {format} matrix")))?;
        data.resize(bytes, 0u8);
        let off = data.as_ptr().align_offset(64).min(63);
        Ok(Self { data, off, count, tile_bytes })
    }

    /// How many tiles.
    #[cfg(test)]
    pub(super) fn count(&self) -> usize {
        self.count
    }

    /// Tile `t`.
    pub(super) fn get(&self, t: usize) -> &[u8] {
        &self.data[self.off + t * self.tile_bytes..][..self.tile_bytes]
    }

    /// Every tile, mutably, for filling in parallel.
    pub(super) fn par_mut(&mut self) -> rayon::slice::ChunksMut<'_, u8> {
        let len = self.size_in_bytes();
        self.data[self.off..self.off + len].par_chunks_mut(self.tile_bytes)
    }

    /// Bytes held (the tiles, with their padding rows).
    pub(super) fn size_in_bytes(&self) -> usize {
        self.count * self.tile_bytes
    }

    /// What a kernel reading tiles `tiles` may prefetch: up to the end of the last.
    fn ahead(&self, tiles: Range<usize>) -> Ahead {
        if tiles.is_empty() {
            return Ahead::NONE;
        }
        Ahead { end: self.get(tiles.end - 1).as_ptr_range().end as usize }
    }
}

/// Runs `f` on this thread's scratch in `key`, or on a fresh one when that is already borrowed
/// (a re-entrant product: rayon work stealing can start one inside another on this thread).
pub(super) fn with_scratch<S: Default + 'static, R>(key: &'static LocalKey<RefCell<S>>, f: impl FnOnce(&mut S) -> R) -> R {
    key.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut S::default()),
    })
}

/// Fills `out` (`rows × n`, row-major) from the `packed` tiles of an `[n, k]` matrix, tile by
/// tile: `kernel(state, t, r0..r1, block, ahead)` writes the 16 outputs of tile `t` for
/// activation rows `r0..r1` into `block` (one entry per row), prefetching through `ahead`; the
/// columns past `n` of the last tile are dropped. `chunk_state()` is called once per chunk of
/// tiles, on the thread that runs it (the AMX path configures its tile registers there).
pub(super) fn run<S>(
    n: usize,
    packed: &Tiles,
    rows: usize,
    out: &mut [f32],
    chunk_state: impl Fn() -> S + Sync,
    kernel: impl Fn(&mut S, usize, Range<usize>, &mut [[f32; TN]], Ahead) + Sync,
) {
    assert_eq!(out.len(), rows * n);
    if rows == 0 || n == 0 {
        return;
    }
    let tile_bytes = packed.tile_bytes;
    let tiles = n.div_ceil(TN);
    assert!(tiles <= packed.count);
    let threads = rayon::current_num_threads().max(1);
    // Chunks of whole tiles: at least ~64 KiB of weights × rows of work, ~4 per thread.
    let min_tiles = (64 * 1024 / tile_bytes.saturating_mul(rows).max(1)).max(1);
    let chunk = tiles.div_ceil(threads * 4).max(min_tiles);
    let dst = Columns(out.as_mut_ptr());
    let one_chunk = |c: usize| {
        let mut state = chunk_state();
        let mut local = [[0f32; TN]; ROW_GROUP];
        let mine = c * chunk..((c + 1) * chunk).min(tiles);
        let ahead = packed.ahead(mine.clone());
        for r0 in (0..rows).step_by(ROW_GROUP) {
            let r1 = (r0 + ROW_GROUP).min(rows);
            for t in mine.clone() {
                let part = &mut local[..r1 - r0];
                kernel(&mut state, t, r0..r1, part, ahead);
                let cols = TN.min(n - t * TN);
                for (r, v) in (r0..r1).zip(part.iter()) {
                    // SAFETY: `out` is `rows × n` (asserted above) and `t·16 + cols ≤ n`; each
                    // chunk owns its tiles' columns, so no two writers meet.
                    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), dst.at(r * n + t * TN), cols) };
                }
            }
        }
    };
    let chunks = tiles.div_ceil(chunk);
    if chunks == 1 || threads == 1 {
        (0..chunks).for_each(one_chunk);
    } else {
        (0..chunks).into_par_iter().for_each(one_chunk);
    }
}

/// The output of a product, written by several chunks at once, each into its own columns.
struct Columns(*mut f32);

// SAFETY: only `run` writes through it, to disjoint columns per chunk.
unsafe impl Sync for Columns {}

impl Columns {
    /// Element `i` (a method, so closures capture the whole `Sync` wrapper).
    fn at(&self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel's steps over a chunk ask for every line from `AHEAD` past the chunk's start up
    /// to its end once, in order, and for nothing at or past the end; split steps ask for the
    /// same lines; `NONE`, and every pass after the first, ask for nothing.
    #[test]
    fn ahead_asks_for_each_line_of_the_chunk_once() {
        let lines_of = |start: usize, end: usize, step: usize, parts: usize| {
            let ahead = Ahead { end };
            let mut got = Vec::new();
            for at in (start..end).step_by(step) {
                for i in 0..parts {
                    got.extend(ahead.part_lines(at, step, i, parts));
                }
            }
            got
        };
        for (start, step) in [(0x1000usize, 544usize), (0x1040, 352), (0x2010, 288), (0x3000, 2304), (0x4000, 3360)] {
            let end = start + 200 * step;
            let want: Vec<usize> = ((start + AHEAD).next_multiple_of(64)..end).step_by(64).collect();
            assert_eq!(lines_of(start, end, step, 1), want, "step {step}");
            assert_eq!(lines_of(start, end, step, 8), want, "step {step} in 8 parts");
            assert!(Ahead::NONE.lines(start, step).next().is_none());
            assert_eq!(Ahead { end }.for_pass(0).lines(start, step).count(), Ahead { end }.lines(start, step).count());
            assert!(Ahead { end }.for_pass(1).lines(start, step).next().is_none());
        }
        // Addresses near the top never overflow.
        assert!(Ahead { end: usize::MAX }.lines(usize::MAX - 10, 1 << 20).all(|l| l % 64 == 0));
    }
}
