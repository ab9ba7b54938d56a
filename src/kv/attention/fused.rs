//! The fused CPU kernel of [`super::paged_attention`]: work items of (tile of up to [`TILE`]
//! query rows of one sequence, KV head) run in parallel; each attends its positions with scores,
//! softmax and weighted values in f32 (an online softmax past one key block), as plain loops or,
//! on AVX2, micro-kernels over rows gathered as f32 or read in place (`attention_x86`).

use std::cell::RefCell;

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use super::rows::RowPtr;
use super::rows::{KvRows, KvView};
use super::{AttentionPlan, LayerAttention};
use crate::kv::layers::HeadShape;
use crate::simd::{self, Level};

/// Below this many multiply-adds in a call, run inline.
const PAR_MIN_MACS: usize = 1 << 16;

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Keys or values of up to [`GATHER`] positions, widened to f32 rows side by side.
    #[cfg(target_arch = "x86_64")]
    static GATHERED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Positions gathered at a time for the AVX2 micro-kernels of a prompt tile (32 KiB of f32
/// rows at a head size of 128: they stay in L1 while every row of the tile reads them, and a
/// narrower pool is widened once for all of them).
#[cfg(target_arch = "x86_64")]
const GATHER: usize = 64;

/// Query rows of one sequence attended together: each K/V row read (and widened or
/// dequantized) once serves all of them.
const TILE: usize = 16;

/// Key positions per block of the fused kernel's scores: a tile's scratch is at most
/// `TILE · rep · KEY_BLOCK` floats (2 MB for Qwen3-0.6B's 2 query heads per KV head), whatever
/// the context. Rows that see more take an online softmax over blocks.
pub(super) const KEY_BLOCK: usize = 1 << 14;

/// The fused kernel over one layer's pool, whose KV head `g` is read through `head(g)`. Work
/// items are (tile of up to [`TILE`] consecutive rows of one sequence, KV head).
pub(super) fn fused<S: KvRows>(
    qd: &[f32],
    plan: &AttentionPlan,
    // The pool's block size and the layer's heads.
    (block_size, shape): (usize, HeadShape),
    nh: usize,
    how: LayerAttention,
    block: usize,
    head: impl Fn(usize) -> S + Sync,
) -> Vec<f32> {
    let (nkv, hd, bs) = (shape.kv_heads, shape.head_dim, block_size);
    let rep = nh / nkv;
    let width = nh * hd;
    let rows = qd.len() / width;
    let macs = plan.attended * nh * hd;
    let simd = simd::level();
    let scale = how.scale(hd);
    // (span, first row of the tile within the span, rows).
    let tiles: Vec<(usize, usize, usize)> = plan
        .spans
        .iter()
        .enumerate()
        .flat_map(|(si, s)| (0..s.len).step_by(TILE).map(move |r| (si, r, TILE.min(s.len - r))))
        .collect();
    let item = |i: usize| -> Vec<f32> {
        let ((si, r0, n), g) = (tiles[i / nkv], i % nkv);
        let s = &plan.spans[si];
        let mut q = Vec::with_capacity(n * rep * hd);
        for r in 0..n {
            q.extend_from_slice(&qd[(s.row + r0 + r) * width + g * rep * hd..][..rep * hd]);
        }
        let mut o = vec![0f32; n * rep * hd];
        let view = KvView { rows: head(g), blocks: s.blocks, bs, hd };
        SCORES.with(|sc| {
            let mut sc = sc.borrow_mut();
            let p0 = s.pos + r0;
            let need = n * rep * (p0 + n - first_seen(p0, how.window)).min(block);
            if sc.len() < need {
                sc.resize(need, 0.0);
            }
            attend(&q, &view, p0, n, rep, scale, how.window, block, &mut sc[..need], &mut o, simd);
        });
        o
    };
    let parts: Vec<Vec<f32>> = if macs >= PAR_MIN_MACS && tiles.len() * nkv > 1 {
        (0..tiles.len() * nkv).into_par_iter().map(item).collect()
    } else {
        (0..tiles.len() * nkv).map(item).collect()
    };
    let mut out = vec![0f32; rows * width];
    for (i, part) in parts.iter().enumerate() {
        let ((si, r0, _), g) = (tiles[i / nkv], i % nkv);
        for (r, o) in part.chunks_exact(rep * hd).enumerate() {
            out[(plan.spans[si].row + r0 + r) * width + g * rep * hd..][..rep * hd].copy_from_slice(o);
        }
    }
    out
}

/// A tile of `n` query rows of one sequence (the first at position `p0`) and one KV head:
/// `q`, `out` `[n, rep, hd]`; `sc` `[n · rep, min(p0 + n, block)]` scratch. Row `r` attends
/// positions `0 ..= p0 + r`; each (row, head) is summed in the same order whatever the tile.
/// Up to `block` positions the softmax is one pass; past it, an online softmax over key
/// blocks of `block` positions keeps the scratch bounded whatever the context.
// The innermost kernel, called per tile and head: plain arguments rather than a struct built
// per call.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend<S: KvRows>(
    q: &[f32],
    kv: &KvView<S>,
    p0: usize,
    n: usize,
    rep: usize,
    scale: f32,
    window: Option<usize>,
    block: usize,
    sc: &mut [f32],
    out: &mut [f32],
    simd: Level,
) {
    match simd {
        // SAFETY: `Avx2Fma` is only constructed after detecting both features.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2Fma => unsafe { attend_avx2(q, kv, p0, n, rep, scale, window, block, sc, out) },
        Level::Portable => attend_body(q, kv, p0, n, rep, scale, window, block, sc, out, Level::Portable),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_avx2<S: KvRows>(
    q: &[f32],
    kv: &KvView<S>,
    p0: usize,
    n: usize,
    rep: usize,
    scale: f32,
    window: Option<usize>,
    block: usize,
    sc: &mut [f32],
    out: &mut [f32],
) {
    attend_body(q, kv, p0, n, rep, scale, window, block, sc, out, Level::Avx2Fma)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_body<S: KvRows>(
    q: &[f32],
    kv: &KvView<S>,
    p0: usize,
    n: usize,
    rep: usize,
    scale: f32,
    window: Option<usize>,
    block: usize,
    sc: &mut [f32],
    out: &mut [f32],
    simd: Level,
) {
    let len = p0 + n;
    // The tile reads positions `from..len`: what its first row sees (all of them without a
    // window; a later row's window starts later, and it weighs the positions before it by 0).
    let from = first_seen(p0, window);
    if len - from > block {
        return attend_blocked(q, kv, p0, n, rep, scale, window, block, sc, out, simd);
    }
    let stride = len - from;
    // 1. Scores: position j is seen by the rows at positions ≥ j.
    scores(q, kv, p0, n, rep, scale, (from, len), stride, sc, simd);
    // 2. Softmax per (row, query head) over what that row sees.
    for (qi, s) in sc.chunks_mut(stride).take(n * rep).enumerate() {
        let s = &mut s[..p0 + qi / rep + 1 - from];
        let (hidden, s) = s.split_at_mut(first_seen(p0 + qi / rep, window) - from);
        hidden.fill(0.0);
        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum = simd::exp_sub_sum_at(simd, s, m);
        let inv = 1.0 / sum;
        s.iter_mut().for_each(|x| *x *= inv);
    }
    // 3. Weighted sum of values.
    out.fill(0.0);
    weigh_values(kv, p0, n, rep, (from, len), stride, sc, out, simd);
}

/// The first position a row at position `p` sees: 0, or with a sliding window of `w`
/// positions (itself included, as HF's `kv > q - w`), `p + 1 - w`.
#[inline(always)]
pub(super) fn first_seen(p: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (p + 1).saturating_sub(w))
}

/// Scores `q·k · scale` of positions `from..to` for the rows that see them, into `sc` rows of
/// `stride` (column `j - from`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn scores<S: KvRows>(
    q: &[f32],
    kv: &KvView<S>,
    p0: usize,
    n: usize,
    rep: usize,
    scale: f32,
    (from, to): (usize, usize),
    stride: usize,
    sc: &mut [f32],
    simd: Level,
) {
    let hd = kv.hd;
    #[cfg(target_arch = "x86_64")]
    if simd == Level::Avx2Fma && hd.is_multiple_of(8) {
        let q_row = |qi: usize| &q[qi * hd..(qi + 1) * hd];
        let done = in_place(kv, false, p0, n, rep, (from, to), |qi, j0, rows, seen| {
            let o = &mut sc[qi * stride + j0 - from..][..seen];
            // SAFETY: `in_place` runs only with F16C, `Avx2Fma` means AVX2 and FMA; `hd` is a
            // multiple of 8 and every row pointer is a pool row of `hd` values.
            unsafe {
                match rows {
                    InPlace::F32(r) => crate::kv::attention_x86::scores_in_place(q_row(qi), &r, scale, o),
                    InPlace::F16(r) => crate::kv::attention_x86::scores_in_place(q_row(qi), &r, scale, o),
                }
            }
        });
        if done {
            return;
        }
        return gathered(kv, false, p0, n, rep, (from, to), |qi, j0, keys, seen| {
            // SAFETY: `Avx2Fma` is only constructed after detecting AVX2 and FMA; `hd` is a
            // multiple of 8 and `keys` holds `seen` rows of `hd`.
            unsafe {
                crate::kv::attention_x86::scores(
                    &q[qi * hd..(qi + 1) * hd],
                    keys,
                    scale,
                    &mut sc[qi * stride + j0 - from..][..seen],
                )
            }
        });
    }
    // `dot_at` / `axpy_at` (not `dot` / `axpy`): these closures do not inherit
    // `attend_avx2`'s target features, so inlined code here would be SSE only.
    kv.for_rows(from, to, |j, slot| {
        kv.rows.with_row(false, slot, |kr| {
            for qi in j.saturating_sub(p0) * rep..n * rep {
                sc[qi * stride + j - from] = simd::dot_at(simd, &q[qi * hd..(qi + 1) * hd], kr) * scale;
            }
        })
    });
}

/// Rows of a block read in place by the kernels.
#[cfg(target_arch = "x86_64")]
enum InPlace<'a> {
    F32(simd::x86::F32Rows<'a>),
    F16(simd::x86::F16Rows<'a>),
}

/// Positions [`in_place`] runs every query head of a KV head over before the next: the
/// second head finds the block's rows (4 KiB of f32 at a head size of 128) in L1.
#[cfg(target_arch = "x86_64")]
const IN_PLACE_BLOCK: usize = 8;

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// Where positions `from..to` of the head being read sit in the pool.
    static IN_PLACE: RefCell<(Vec<*const f32>, Vec<*const half::f16>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// [`gathered`] without the gathering, for one decode row (`n == 1`): its query heads read
/// the pool's f32 or f16 rows where they are, [`IN_PLACE_BLOCK`] positions for every head in
/// turn. A head's rows are consecutive in the (head-major) pool, so the hardware prefetchers
/// stream them; with one row there is no tile to keep in L1, and an f16 pool is read at half
/// the bytes instead of widened into a copy.
/// Returns false, having run nothing, for other tiles, other pools (bf16, quantized) and
/// CPUs without F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn in_place<S: KvRows>(
    kv: &KvView<S>,
    value: bool,
    p0: usize,
    n: usize,
    rep: usize,
    (from, to): (usize, usize),
    mut f: impl FnMut(usize, usize, InPlace<'_>, usize),
) -> bool {
    if n != 1 || from >= to || !crate::kv::attention_x86::has_f16c() {
        return false;
    }
    IN_PLACE.with(|c| {
        let (f32s, f16s) = &mut *c.borrow_mut();
        f32s.clear();
        f16s.clear();
        let mut other = false;
        kv.for_rows(from, to, |_, slot| match kv.rows.row_ptr(value, slot) {
            RowPtr::F32(p) => f32s.push(p),
            RowPtr::F16(p) => f16s.push(p),
            RowPtr::None => other = true,
        });
        let len = to - from;
        if other || (f32s.len() != len && f16s.len() != len) {
            return false;
        }
        for j0 in (from..to).step_by(IN_PLACE_BLOCK) {
            let j1 = (j0 + IN_PLACE_BLOCK).min(to);
            for qi in j0.saturating_sub(p0) * rep..rep {
                let seen = (p0 + qi / rep + 1).min(j1) - j0;
                let at = j0 - from..j0 - from + seen;
                let rows = if f32s.is_empty() {
                    InPlace::F16(simd::x86::F16Rows(&f16s[at]))
                } else {
                    InPlace::F32(simd::x86::F32Rows(&f32s[at]))
                };
                f(qi, j0, rows, seen);
            }
        }
        true
    })
}

/// Runs `f(qi, j0, rows, seen)` per block of up to [`GATHER`] positions `j0..` of `from..to`,
/// gathered as f32 rows (keys, or values when `value`), for each query row `qi` that sees
/// the block's first position; `seen` is how many of the block's positions it sees.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn gathered<S: KvRows>(
    kv: &KvView<S>,
    value: bool,
    p0: usize,
    n: usize,
    rep: usize,
    (from, to): (usize, usize),
    mut f: impl FnMut(usize, usize, &[f32], usize),
) {
    let hd = kv.hd;
    GATHERED.with(|g| {
        let mut g = g.borrow_mut();
        if g.len() < GATHER * hd {
            g.resize(GATHER * hd, 0.0);
        }
        for j0 in (from..to).step_by(GATHER) {
            let j1 = (j0 + GATHER).min(to);
            let rows = &mut g[..(j1 - j0) * hd];
            kv.for_rows(j0, j1, |j, slot| kv.rows.row_into(value, slot, &mut rows[(j - j0) * hd..][..hd]));
            for qi in j0.saturating_sub(p0) * rep..n * rep {
                let seen = (p0 + qi / rep + 1).min(j1) - j0;
                f(qi, j0, rows, seen);
            }
        }
    });
}

/// `out += p · v` over positions `from..to` for the rows that see them, `p` read from `sc` as
/// [`scores`] wrote it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn weigh_values<S: KvRows>(
    kv: &KvView<S>,
    p0: usize,
    n: usize,
    rep: usize,
    (from, to): (usize, usize),
    stride: usize,
    sc: &[f32],
    out: &mut [f32],
    simd: Level,
) {
    let hd = kv.hd;
    #[cfg(target_arch = "x86_64")]
    if simd == Level::Avx2Fma && hd.is_multiple_of(8) {
        let done = in_place(kv, true, p0, n, rep, (from, to), |qi, j0, rows, seen| {
            let (p, o) = (&sc[qi * stride + j0 - from..][..seen], &mut out[qi * hd..(qi + 1) * hd]);
            // SAFETY: as in `scores`.
            unsafe {
                match rows {
                    InPlace::F32(r) => crate::kv::attention_x86::weigh_in_place(p, &r, o),
                    InPlace::F16(r) => crate::kv::attention_x86::weigh_in_place(p, &r, o),
                }
            }
        });
        if done {
            return;
        }
        return gathered(kv, true, p0, n, rep, (from, to), |qi, j0, values, seen| {
            let p = &sc[qi * stride + j0 - from..][..seen];
            // SAFETY: as in `scores`.
            unsafe { crate::kv::attention_x86::weigh(p, values, &mut out[qi * hd..(qi + 1) * hd]) }
        });
    }
    kv.for_rows(from, to, |j, slot| {
        kv.rows.with_row(true, slot, |vr| {
            for qi in j.saturating_sub(p0) * rep..n * rep {
                simd::axpy_at(simd, sc[qi * stride + j - from], vr, &mut out[qi * hd..(qi + 1) * hd]);
            }
        })
    });
}

/// [`attend_body`] past one key block (of the positions from the tile's first row's first):
/// per block of `block` positions, the scores of the
/// rows that see it (`sc` rows of stride `block`), then a running max `m`, sum `l` and
/// unnormalised output per (row, query head), rescaled when the max grows; `out` is divided
/// by `l` at the end. Same order per (row, head) whatever the tile.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_blocked<S: KvRows>(
    q: &[f32],
    kv: &KvView<S>,
    p0: usize,
    n: usize,
    rep: usize,
    scale: f32,
    window: Option<usize>,
    block: usize,
    sc: &mut [f32],
    out: &mut [f32],
    simd: Level,
) {
    let (hd, len) = (kv.hd, p0 + n);
    // Allocated per call: this path runs only past `block` positions, where the work per call
    // dwarfs it.
    let mut m = vec![f32::NEG_INFINITY; n * rep];
    let mut l = vec![0f32; n * rep];
    out.fill(0.0);
    for b0 in (first_seen(p0, window)..len).step_by(block) {
        let b1 = (b0 + block).min(len);
        // Rows at positions < b0 see nothing of this block.
        let first = b0.saturating_sub(p0) * rep;
        // 1. Scores of the block.
        scores(q, kv, p0, n, rep, scale, (b0, b1), block, sc, simd);
        // 2. Fold the block into each row's running max and sum; rescale what it has summed.
        for qi in first..n * rep {
            let seen = (p0 + qi / rep + 1).min(b1) - b0;
            // Positions before the row's window weigh 0; a block wholly before it changes nothing.
            let hidden = first_seen(p0 + qi / rep, window).saturating_sub(b0).min(seen);
            let (before, s) = sc[qi * block..qi * block + seen].split_at_mut(hidden);
            before.fill(0.0);
            if s.is_empty() {
                continue;
            }
            let m_new = s.iter().copied().fold(m[qi], f32::max);
            let sum = simd::exp_sub_sum_at(simd, s, m_new);
            let alpha = simd::exp(m[qi] - m_new);
            if alpha != 1.0 {
                out[qi * hd..(qi + 1) * hd].iter_mut().for_each(|o| *o *= alpha);
            }
            l[qi] = l[qi] * alpha + sum;
            m[qi] = m_new;
        }
        // 3. Unnormalised weighted sum of the block's values.
        weigh_values(kv, p0, n, rep, (b0, b1), block, sc, out, simd);
    }
    for qi in 0..n * rep {
        let inv = 1.0 / l[qi];
        out[qi * hd..(qi + 1) * hd].iter_mut().for_each(|o| *o *= inv);
    }
}
