//! The thread split shared by the packed matrix kernels ([`super::q8`], [`super::kquant`]):
//! a weight is stored in tiles of 16 output rows; chunks of whole tiles run on rayon (candle's
//! own pool spins on a barrier), each writing its own columns of the output; within a chunk,
//! activation rows go in groups of 64 so a tile's weights stay in cache while the rows stream
//! past. Small products run on the calling thread.

use std::ops::Range;

use rayon::prelude::*;

/// Output rows per tile.
pub(super) const TN: usize = 16;
/// Activation rows per pass over a tile's weights.
const ROW_GROUP: usize = 64;

/// Fills `out` (`rows × n`, row-major) tile by tile: `kernel(state, t, r0..r1, block)` writes
/// the 16 outputs of tile `t` for activation rows `r0..r1` into `block` (one entry per row);
/// the columns past `n` of the last tile are dropped. `chunk_state()` is called once per chunk
/// of tiles, on the thread that runs it (the AMX path configures its tile registers there).
pub(super) fn run<S>(
    n: usize,
    tile_bytes: usize,
    rows: usize,
    out: &mut [f32],
    chunk_state: impl Fn() -> S + Sync,
    kernel: impl Fn(&mut S, usize, Range<usize>, &mut [[f32; TN]]) + Sync,
) {
    assert_eq!(out.len(), rows * n);
    if rows == 0 || n == 0 {
        return;
    }
    let tiles = n.div_ceil(TN);
    let threads = rayon::current_num_threads().max(1);
    // Chunks of whole tiles: at least ~64 KiB of weights × rows of work, ~4 per thread.
    let min_tiles = (64 * 1024 / tile_bytes.saturating_mul(rows).max(1)).max(1);
    let chunk = tiles.div_ceil(threads * 4).max(min_tiles);
    let dst = Columns(out.as_mut_ptr());
    let one_chunk = |c: usize| {
        let mut state = chunk_state();
        let mut local = [[0f32; TN]; ROW_GROUP];
        for r0 in (0..rows).step_by(ROW_GROUP) {
            let r1 = (r0 + ROW_GROUP).min(rows);
            for t in c * chunk..((c + 1) * chunk).min(tiles) {
                let part = &mut local[..r1 - r0];
                kernel(&mut state, t, r0..r1, part);
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
