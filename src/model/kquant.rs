//! Our own K-quant (Q4_K, Q5_K, Q6_K) matrix kernel on CPU: decode, batched decode and prefill
//! all run it, with the same arithmetic for any number of rows (as [`super::q8`] does for Q8_0).
//!
//! Design:
//! - **Layout: a lossless repack.** A K-quant row is made of super-blocks of 256 values, each
//!   with an f16 scale `d` (and, for Q4_K / Q5_K, an f16 `dmin`) and small integer scales per
//!   sub-block: Q4_K / Q5_K value `(d·sc_j)·q − dmin·m_j` with `q ∈ 0..16` / `0..32` and 6-bit
//!   `sc_j`, `m_j` per 32 values; Q6_K value `(d·sc_j)·(q − 32)` with `q ∈ 0..64` and an `i8`
//!   `sc_j` per 16 values. At load every integer and scale is moved, unchanged, into tiles of 16
//!   output rows. Per super-block a tile holds:
//!   - the low 4 bits of every `q` as 32 lines of 64 bytes in [`super::nibbles`]' layout: line
//!     `p` holds, for each of the 16 rows in turn, 4 bytes whose low nibbles are values
//!     `8p..8p+4` and high nibbles values `8p+4..8p+8` (a nibble mask and a shift give two VNNI
//!     operands, whose 16 lanes are the 16 outputs);
//!   - Q5_K: the fifth bit of the 32 values of sub-block `j` in a 64-byte line (row `lane`'s
//!     4 bytes; line `l` of the sub-block's low nibbles in bit `2l`, its high nibbles in
//!     `2l + 1`); Q6_K: bits 4–5 of the 16 values of group `j` in a 64-byte line (bit pair
//!     `2·(2l + h)` for line `l` ∈ 0..2 and half `h`);
//!   - the sub-block scales (and Q4_K / Q5_K mins) as pairs per row: byte `32·t + 2·lane + i`
//!     is sub-block `2t + i`'s (a zero-extended load is then a 16-lane vector of `i16` pairs);
//!   - the rows' `d` (and `dmin`) as f16, padded to a multiple of 64 bytes.
//!
//!   That is 4.6 / 5.6 / 6.6 bits per weight against the file's 4.5 / 5.5 / 6.6; dequantizing
//!   it gives candle's (ggml's) values bit for bit (tested), and it is the only copy kept.
//! - **Numerics.** Each activation row is quantized to Q8_K as ggml does on x86
//!   (`quantize_row_q8_K_ref`: per 256 values `iscale = −127 / max`, `q = round-half-even(x ·
//!   iscale)`, `d = 1 / iscale`), with sums of its quants per 16 and per 32 values. Per
//!   super-block the integer parts of llama.cpp's dot products are computed exactly: Q4_K /
//!   Q5_K `I = Σ_j sc_j · Σ q_w q_x` and `M = Σ_j m_j · Σ q_x`; Q6_K `I = Σ_j sc_j · (Σ q_w q_x −
//!   32 · Σ q_x)`. Then per output, super-blocks in order, in f32 with each product and sum
//!   rounded (no FMA): `acc = (acc + (d · d_x) · I) − (dmin · d_x) · M` (Q6_K: without the `M`
//!   term). So every path gives the same bits, and a row's result does not depend on how many
//!   rows share the call. The integers fit `i32` with room to spare (the bounds are at
//!   [`Kind`]).
//! - **Paths** ([`q8::Path`]): AVX-512 VNNI (`vpdpbusd` with the unsigned weights, `vpdpwssd`
//!   for the min and offset terms, up to 4 activation rows sharing each weight load; the AMX
//!   path runs it too), AVX2 (the same tiles as two 8-lane halves, `maddubs`, which cannot
//!   saturate here: `2 · 63 · 128 < 2¹⁵`), NEON on aarch64 (`kquant/neon.rs`: 4 vectors of 4
//!   lanes, SDOT or widening multiplies, 2 rows sharing each weight load), portable (plain
//!   loops).
//! - **Threads and allocation** as in [`super::q8`] ([`super::tiled`]; a thread-local scratch for
//!   the quantized activations).

use std::cell::RefCell;

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;
use rayon::prelude::*;

use super::nibbles::{self, LINE};
use super::q8::{self, Path};
use super::tiled::{self, Ahead, PackedMatrix, Tiles, TN};
use crate::error::{EngineError, Result};

/// Values per super-block.
pub const QK_K: usize = 256;
/// Bytes of a tile super-block's low nibbles (8 groups of 32 values, 32 lines).
/// The high-bit lines (Q5_K, Q6_K) follow them.
const NIBBLES: usize = 8 * nibbles::GROUP;

/// A K-quant block format this kernel runs.
///
/// Integer bounds per super-block (`|q_x| ≤ 128`, so `|Σ q_x| ≤ 128` per value):
/// Q4_K `|I| ≤ 8 · 63 · 32 · 15 · 128 ≈ 3.1e7`, `|M| ≤ 8 · 63 · 32 · 128 ≈ 2.1e6`; Q5_K `|I| ≤
/// 6.4e7`; Q6_K `|I| ≤ 16 · 128 · 16 · (63 + 32) · 128 ≈ 4.0e8`: all below `2³¹`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Q4K,
    Q5K,
    Q6K,
}

impl Kind {
    /// The kind of a ggml block type, if this kernel runs it.
    pub fn of(dtype: GgmlDType) -> Option<Kind> {
        match dtype {
            GgmlDType::Q4K => Some(Kind::Q4K),
            GgmlDType::Q5K => Some(Kind::Q5K),
            GgmlDType::Q6K => Some(Kind::Q6K),
            _ => None,
        }
    }

    pub fn dtype(self) -> GgmlDType {
        match self {
            Kind::Q4K => GgmlDType::Q4K,
            Kind::Q5K => GgmlDType::Q5K,
            Kind::Q6K => GgmlDType::Q6K,
        }
    }

    /// Bytes of one ggml block (a super-block of one row).
    fn ggml_bytes(self) -> usize {
        match self {
            Kind::Q4K => 144,
            Kind::Q5K => 176,
            Kind::Q6K => 210,
        }
    }

    /// Sub-blocks with a scale of their own per super-block.
    fn groups(self) -> usize {
        match self {
            Kind::Q4K | Kind::Q5K => 8,
            Kind::Q6K => 16,
        }
    }

    /// Offset of the scale pairs.
    fn scales_at(self) -> usize {
        NIBBLES
            + match self {
                Kind::Q4K => 0,
                Kind::Q5K => 8 * LINE,
                Kind::Q6K => 16 * LINE,
            }
    }

    /// Offset of the min pairs (Q4_K / Q5_K).
    fn mins_at(self) -> usize {
        self.scales_at() + 8 * 16
    }

    /// Offset of the 16 f16 `d` (then, for Q4_K / Q5_K, the 16 `dmin`).
    fn d_at(self) -> usize {
        self.scales_at() + 2 * 8 * 16
    }

    /// Bytes of one tile super-block, a multiple of 64 so every line stays aligned.
    fn block_bytes(self) -> usize {
        let d = if self == Kind::Q6K { 32 } else { 64 };
        (self.d_at() + d).next_multiple_of(64)
    }
}

/// One row's super-block, unpacked: the `q` integers, scales and mins, and the f16 bits of `d`
/// and `dmin`. Q6_K's scales are `i8` (stored as their bits).
struct Super {
    q: [u8; QK_K],
    sc: [u8; 16],
    m: [u8; 8],
    d: u16,
    dmin: u16,
}

impl Super {
    fn zero() -> Self {
        Super { q: [0; QK_K], sc: [0; 16], m: [0; 8], d: 0, dmin: 0 }
    }

    /// Reads one ggml block (`kind.ggml_bytes()` bytes, ggml's `block_q4_K` / `block_q5_K` /
    /// `block_q6_K`).
    fn read_ggml(&mut self, kind: Kind, b: &[u8]) {
        let h16 = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        match kind {
            Kind::Q4K | Kind::Q5K => {
                self.d = h16(0);
                self.dmin = h16(2);
                let scales = &b[4..16];
                for j in 0..8 {
                    (self.sc[j], self.m[j]) = scale_min_k4(j, scales);
                }
                let (qh, qs) = if kind == Kind::Q5K { (&b[16..48], &b[48..176]) } else { (&b[16..16], &b[16..144]) };
                // Chunk `c` of 64 values: low nibbles of `qs[32c..32c+32]`, then high nibbles;
                // Q5_K's fifth bit of value `64c + 32h + l` is bit `2c + h` of `qh[l]`.
                let qh: &[u8; 32] = if kind == Kind::Q5K { qh.try_into().expect("32 bytes") } else { &[0; 32] };
                for (c, (out, qs)) in self.q.chunks_exact_mut(64).zip(qs.chunks_exact(32)).enumerate() {
                    let (lo, hi) = out.split_at_mut(32);
                    for l in 0..32 {
                        lo[l] = (qs[l] & 0x0F) | (((qh[l] >> (2 * c)) & 1) << 4);
                        hi[l] = (qs[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
                    }
                }
            }
            Kind::Q6K => {
                let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
                self.d = h16(208);
                self.sc.copy_from_slice(scales);
                // Value `128n + 32i + l`: nibble `i / 2` of `ql[64n + 32(i % 2) + l]`, bits 4–5
                // from bits `2i` of `qh[32n + l]`.
                for (n, out) in self.q.chunks_exact_mut(128).enumerate() {
                    let (ql, qh) = (&ql[64 * n..][..64], &qh[32 * n..][..32]);
                    for (i, out) in out.chunks_exact_mut(32).enumerate() {
                        let ql = &ql[32 * (i % 2)..][..32];
                        for l in 0..32 {
                            out[l] = ((ql[l] >> (4 * (i / 2))) & 0x0F) | (((qh[l] >> (2 * i)) & 3) << 4);
                        }
                    }
                }
            }
        }
    }

    /// Writes this super-block as row `lane` of a tile super-block (see the module note).
    fn put(&self, kind: Kind, blk: &mut [u8], lane: usize) {
        let (lines, high) = blk.split_at_mut(NIBBLES);
        // Group `g` of 32 values in the nibble layout; Q5_K's fifth bits in line `g`.
        for (g, q) in self.q.chunks_exact(32).enumerate() {
            let group = &mut lines[g * nibbles::GROUP..][..nibbles::GROUP];
            let fifth = (kind == Kind::Q5K).then(|| &mut high[g * LINE..][..LINE]);
            nibbles::put_block(group, fifth, lane, q);
        }
        if kind == Kind::Q6K {
            for (v, &q) in self.q.iter().enumerate() {
                let (j, p, h, i) = q6_high_at(v);
                high[j * LINE + lane * 4 + i] |= ((q >> 4) & 3) << (2 * (2 * p + h));
            }
        }
        for j in 0..kind.groups() {
            blk[kind.scales_at() + pair_at(j, lane)] = self.sc[j];
            if kind != Kind::Q6K {
                blk[kind.mins_at() + pair_at(j, lane)] = self.m[j];
            }
        }
        blk[kind.d_at() + lane * 2..][..2].copy_from_slice(&self.d.to_le_bytes());
        if kind != Kind::Q6K {
            blk[kind.d_at() + 32 + lane * 2..][..2].copy_from_slice(&self.dmin.to_le_bytes());
        }
    }

    /// Reads row `lane` back from a tile super-block.
    fn get(kind: Kind, blk: &[u8], lane: usize) -> Self {
        let mut s = Super::zero();
        let (lines, high) = blk.split_at(NIBBLES);
        for (v, q) in s.q.iter_mut().enumerate() {
            let (g, w) = (v / 32, v % 32);
            let fifth = (kind == Kind::Q5K).then(|| &high[g * LINE..][..LINE]);
            *q = nibbles::get(&lines[g * nibbles::GROUP..][..nibbles::GROUP], fifth, lane, w);
            if kind == Kind::Q6K {
                let (j, p, h, i) = q6_high_at(v);
                *q |= ((high[j * LINE + lane * 4 + i] >> (2 * (2 * p + h))) & 3) << 4;
            }
        }
        for j in 0..kind.groups() {
            s.sc[j] = blk[kind.scales_at() + pair_at(j, lane)];
            if kind != Kind::Q6K {
                s.m[j] = blk[kind.mins_at() + pair_at(j, lane)];
            }
        }
        s.d = u16::from_le_bytes([blk[kind.d_at() + lane * 2], blk[kind.d_at() + lane * 2 + 1]]);
        if kind != Kind::Q6K {
            s.dmin = u16::from_le_bytes([blk[kind.d_at() + 32 + lane * 2], blk[kind.d_at() + 33 + lane * 2]]);
        }
        s
    }

    /// The 256 values as candle's (ggml's) `to_float` computes them.
    fn dequantize(&self, kind: Kind, out: &mut [f32]) {
        let d = f16::from_bits(self.d).to_f32();
        match kind {
            Kind::Q4K | Kind::Q5K => {
                let dmin = f16::from_bits(self.dmin).to_f32();
                for (v, o) in out.iter_mut().enumerate() {
                    let j = v / 32;
                    *o = (d * self.sc[j] as f32) * self.q[v] as f32 - dmin * self.m[j] as f32;
                }
            }
            Kind::Q6K => {
                for (v, o) in out.iter_mut().enumerate() {
                    *o = (d * self.sc[v / 16] as i8 as f32) * (self.q[v] as i32 - 32) as f32;
                }
            }
        }
    }
}

/// Where bits 4–5 of Q6_K value `v` sit: `(group j of 16 values, its line p ∈ 0..2, half h,
/// byte i of the row)`, the bit pair being `2 · (2p + h)` of that byte in the group's line.
#[inline(always)]
fn q6_high_at(v: usize) -> (usize, usize, usize, usize) {
    (v / 16, (v / 8) % 2, (v / 4) % 2, v % 4)
}

/// ggml's `get_scale_min_k4`: sub-block `j`'s 6-bit scale and min from the 12 packed bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Byte of sub-block `j`'s scale (or min) for row `lane` within the pairs.
#[inline(always)]
fn pair_at(j: usize, lane: usize) -> usize {
    (j / 2) * 32 + lane * 2 + j % 2
}

/// Activation rows quantized to Q8_K: `q [rows, k]`, `d [rows, nsb]`, and the sums of the
/// quants per 16 values (`s16 [rows, nsb · 16]`) and per 32 (`s32 [rows, nsb · 8]`), as `i16`
/// (at most `32 · 128` in magnitude).
#[derive(Default)]
struct QuantRows {
    q: Vec<i8>,
    d: Vec<f32>,
    s16: Vec<i16>,
    s32: Vec<i16>,
}

impl QuantRows {
    fn fill(&mut self, x: &[f32], rows: usize, k: usize) {
        let nsb = k / QK_K;
        self.q.resize(rows * k, 0);
        self.d.resize(rows * nsb, 0.0);
        self.s16.resize(rows * nsb * 16, 0);
        self.s32.resize(rows * nsb * 8, 0);
        let sums = |((s16, s32), q): ((&mut [i16], &mut [i16]), &[i8])| {
            for (s, c) in s16.iter_mut().zip(q.chunks_exact(16)) {
                *s = c.iter().map(|&v| v as i16).sum();
            }
            for (s, c) in s32.iter_mut().zip(s16.chunks_exact(2)) {
                *s = c[0] + c[1];
            }
        };
        if rows == 1 {
            quantize_row(x, &mut self.q, &mut self.d);
            sums(((&mut self.s16[..], &mut self.s32[..]), &self.q[..]));
        } else {
            self.q
                .par_chunks_mut(k)
                .zip(self.d.par_chunks_mut(nsb))
                .zip(x.par_chunks(k))
                .for_each(|((q, d), xr)| quantize_row(xr, q, d));
            self.s16.par_chunks_mut(nsb * 16).zip(self.s32.par_chunks_mut(nsb * 8)).zip(self.q.par_chunks(k)).for_each(sums);
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<QuantRows> = RefCell::new(QuantRows::default());
}

/// Quantizes `x` (`len` a multiple of 256) to Q8_K as ggml's `quantize_row_q8_K_ref`: the value
/// of largest magnitude (the first of equals) sets `iscale = −127 / max`, each quant is
/// `min(127, round-half-even(iscale · x))`, and `d = 1 / iscale`; an all-zero block has `d = 0`.
/// NaN quantizes to 0.
fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    // The same code with SSE4.1, where rounding half to even is one instruction (the baseline
    // x86-64 target calls `rintf` for each value); the results are the same bits.
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.1") {
        // SAFETY: the CPU has SSE4.1 (checked above).
        return unsafe { quantize_row_sse41(x, q, d) };
    }
    quantize_row_body(x, q, d)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
unsafe fn quantize_row_sse41(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    quantize_row_body(x, q, d)
}

#[inline(always)]
fn quantize_row_body(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    for ((xs, qs), db) in x.chunks_exact(QK_K).zip(q.chunks_exact_mut(QK_K)).zip(d.iter_mut()) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xs {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *db = 0.0;
            qs.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (o, &v) in qs.iter_mut().zip(xs) {
            *o = ((iscale * v).round_ties_even() as i32).clamp(-128, 127) as i8;
        }
        *db = 1.0 / iscale;
    }
}

/// A `[n, k]` K-quant weight repacked in 16-row tiles (see the module note).
pub struct PackedK {
    tiles: Tiles,
    kind: Kind,
    n: usize,
    k: usize,
}

impl PackedK {
    /// A zeroed matrix (every scale 0) for `[n, k]`.
    fn zeroed(kind: Kind, n: usize, k: usize) -> Result<Self> {
        let tiles = Tiles::zeroed(n, k, QK_K, kind.block_bytes(), &format!("{kind:?}"))?;
        Ok(Self { tiles, kind, n, k })
    }

    /// Repacks a 2-D Q4_K / Q5_K / Q6_K `QTensor` of shape `[n, k]`.
    pub fn from_qtensor(q: &QTensor) -> Result<Self> {
        let kind = Kind::of(q.dtype())
            .ok_or_else(|| EngineError::InvalidModel(format!("PackedK needs a K-quant, got {:?}", q.dtype())))?;
        let (n, k) = q.shape().dims2()?;
        Self::from_ggml_bytes(kind, &q.data()?, n, k)
    }

    /// Repacks raw ggml blocks (row-major, `k / 256` blocks per row).
    pub fn from_ggml_bytes(kind: Kind, bytes: &[u8], n: usize, k: usize) -> Result<Self> {
        let mut p = Self::zeroed(kind, n, k)?;
        let (nsb, gb) = (p.nsb(), kind.ggml_bytes());
        if nsb.checked_mul(gb).and_then(|row| n.checked_mul(row)) != Some(bytes.len()) {
            return Err(EngineError::InvalidModel(format!("{} bytes of {kind:?} do not make a [{n}, {k}] matrix", bytes.len())));
        }
        let bb = kind.block_bytes();
        p.tiles.par_mut().enumerate().for_each(|(t, tile)| {
            let mut s = Super::zero();
            for lane in 0..TN.min(n - t * TN) {
                for (b, blk) in tile.chunks_exact_mut(bb).enumerate() {
                    s.read_ggml(kind, &bytes[((t * TN + lane) * nsb + b) * gb..][..gb]);
                    s.put(kind, blk, lane);
                }
            }
        });
        Ok(p)
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    fn nsb(&self) -> usize {
        self.k / QK_K
    }

    fn tile(&self, t: usize) -> &[u8] {
        self.tiles.get(t)
    }

    /// Bytes held (the tiles, with their padding rows).
    pub fn size_in_bytes(&self) -> usize {
        self.tiles.size_in_bytes()
    }

    fn matmul_at(&self, path: Path, x: &[f32], rows: usize, out: &mut [f32]) {
        assert_eq!(x.len(), rows * self.k);
        assert_eq!(out.len(), rows * self.n);
        if rows == 0 {
            return;
        }
        tiled::with_scratch(&SCRATCH, |s| self.matmul_quantized(path, s, x, rows, out))
    }

    fn matmul_quantized(&self, path: Path, xs: &mut QuantRows, x: &[f32], rows: usize, out: &mut [f32]) {
        xs.fill(x, rows, self.k);
        let xs = &*xs;
        tiled::run(
            self.n,
            &self.tiles,
            rows,
            out,
            || (),
            |_, t, rows, part, ahead| {
                tile_rows(path, self.kind, self.tile(t), self.nsb(), xs, self.k, rows, part, ahead);
            },
        );
    }
}

impl PackedMatrix for PackedK {
    fn rows(&self) -> usize {
        self.n
    }

    fn cols(&self) -> usize {
        self.k
    }

    /// Candle's `to_float`, bit for bit.
    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.n && out.len() == self.k);
        let bb = self.kind.block_bytes();
        for (blk, o) in self.tile(r / TN).chunks_exact(bb).zip(out.chunks_exact_mut(QK_K)) {
            Super::get(self.kind, blk, r % TN).dequantize(self.kind, o);
        }
    }

    /// Each row quantized to Q8_K first (see the module note).
    fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        self.matmul_at(q8::path(), x, rows, out)
    }
}

/// One tile against activation rows `rows` of `xs`: `out[i]` gets row `rows.start + i`'s 16
/// outputs.
#[allow(clippy::too_many_arguments)]
fn tile_rows(
    path: Path,
    kind: Kind,
    tile: &[u8],
    nsb: usize,
    xs: &QuantRows,
    k: usize,
    rows: std::ops::Range<usize>,
    out: &mut [[f32; TN]],
    ahead: Ahead,
) {
    assert!(tile.len() == nsb * kind.block_bytes() && out.len() == rows.len() && k == nsb * QK_K);
    assert!(
        xs.q.len() >= rows.end * k
            && xs.d.len() >= rows.end * nsb
            && xs.s16.len() >= rows.end * nsb * 16
            && xs.s32.len() >= rows.end * nsb * 8
    );
    match path {
        // SAFETY: each x86 path is only constructed after its features were detected; the
        // asserts above bound every pointer the kernels read (see their notes).
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Vnni | Path::Amx => unsafe { x86::rows_vnni(kind, tile, nsb, xs, rows.start, out, ahead) },
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { x86::rows_avx2(kind, tile, nsb, xs, rows.start, out, ahead) },
        // SAFETY: `NeonDot` is only constructed after SDOT was detected; the asserts above
        // bound every pointer the kernels read.
        #[cfg(target_arch = "aarch64")]
        Path::Neon => unsafe { neon::rows::<false>(kind, tile, nsb, xs, rows.start, out) },
        #[cfg(target_arch = "aarch64")]
        Path::NeonDot => unsafe { neon::rows::<true>(kind, tile, nsb, xs, rows.start, out) },
        Path::Portable => {
            let _ = ahead;
            for (r, o) in rows.zip(out) {
                tile_row_portable(kind, tile, nsb, xs, r, o);
            }
        }
    }
}

/// The reference arithmetic (see the module note), one activation row against one tile, read
/// line by line in the layout's order (contiguous reads).
fn tile_row_portable(kind: Kind, tile: &[u8], nsb: usize, xs: &QuantRows, r: usize, out: &mut [f32; TN]) {
    let mut acc = [0f32; TN];
    let bb = kind.block_bytes();
    // Lines per scale group: 32 values (Q4_K, Q5_K) or 16 (Q6_K) at 8 a line.
    let lines = QK_K / kind.groups() / 8;
    for (b, blk) in tile.chunks_exact(bb).enumerate().take(nsb) {
        let x = &xs.q[(r * nsb + b) * QK_K..][..QK_K];
        let (s16, s32) = (&xs.s16[(r * nsb + b) * 16..][..16], &xs.s32[(r * nsb + b) * 8..][..8]);
        let (mut isum, mut imin) = ([0i32; TN], [0i32; TN]);
        for j in 0..kind.groups() {
            let high = if kind == Kind::Q4K { &[0u8; LINE][..] } else { &blk[NIBBLES + j * LINE..][..LINE] };
            let mut dot = [0i32; TN];
            for l in 0..lines {
                let p = j * lines + l;
                let line = &blk[p * LINE..][..LINE];
                for (lane, s) in dot.iter_mut().enumerate() {
                    for i in 0..4 {
                        let (byte, hb) = (line[lane * 4 + i], high[lane * 4 + i]);
                        let (lo, hi) = match kind {
                            Kind::Q4K | Kind::Q5K => nibbles::pair(byte, hb, l),
                            Kind::Q6K => {
                                ((byte & 0x0F) | ((hb >> (4 * l)) & 3) << 4, (byte >> 4) | ((hb >> (4 * l + 2)) & 3) << 4)
                            }
                        };
                        *s += lo as i32 * x[8 * p + i] as i32 + hi as i32 * x[8 * p + 4 + i] as i32;
                    }
                }
            }
            let scales = &blk[kind.scales_at()..];
            for lane in 0..TN {
                let sc = scales[pair_at(j, lane)];
                match kind {
                    Kind::Q4K | Kind::Q5K => {
                        isum[lane] += sc as i32 * dot[lane];
                        imin[lane] += blk[kind.mins_at() + pair_at(j, lane)] as i32 * s32[j] as i32;
                    }
                    Kind::Q6K => isum[lane] += sc as i8 as i32 * (dot[lane] - 32 * s16[j] as i32),
                }
            }
        }
        let dx = xs.d[r * nsb + b];
        let half = |at: usize, lane: usize| f16::from_le_bytes([blk[at + 2 * lane], blk[at + 2 * lane + 1]]).to_f32();
        for (lane, a) in acc.iter_mut().enumerate() {
            let d = half(kind.d_at(), lane);
            *a = match kind {
                Kind::Q4K | Kind::Q5K => {
                    (*a + (d * dx) * isum[lane] as f32) - (half(kind.d_at() + 32, lane) * dx) * imin[lane] as f32
                }
                Kind::Q6K => *a + (d * dx) * isum[lane] as f32,
            };
        }
    }
    *out = acc;
}

/// Where an activation row's data for super-block `b` starts (the SIMD paths' view of
/// [`QuantRows`]).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
struct Row {
    q: *const i8,
    d: f32,
    s16: *const i16,
    s32: *const i16,
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
impl Row {
    /// # Safety
    /// `xs` holds row `r` of a `k = 256 · nsb` matrix and `b < nsb`.
    #[inline(always)]
    unsafe fn at(xs: &QuantRows, nsb: usize, r: usize, b: usize) -> Row {
        Row {
            q: xs.q.as_ptr().add((r * nsb + b) * QK_K),
            d: *xs.d.get_unchecked(r * nsb + b),
            s16: xs.s16.as_ptr().add((r * nsb + b) * 16),
            s32: xs.s32.as_ptr().add((r * nsb + b) * 8),
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;
