//! Our own matrix kernel on CPU for the block formats of 32 values with one f16 scale and no
//! offset — Q8_0, Q5_0 and Q4_0 ([`Format`]): decode, batched decode and prefill all run it,
//! with the same arithmetic for any number of rows.
//!
//! Design:
//! - **Layout.** At load a `[n, k]` tensor is repacked, losslessly, into tiles of 16 output
//!   rows. For each block column `b` a tile stores the 16 rows' quants as lines of 64 bytes in
//!   the operand layout of a VNNI dot product (whose 16 lanes are then the 16 outputs), as
//!   unsigned integers `u = q + bias`: Q8_0 as 8 lines, line `j` holding `k = 4j..4j+3` of each
//!   row in turn (`u = q + 128`); Q5_0 / Q4_0 as 4 lines of nibbles (+ a line of fifth bits),
//!   as [`Format`] says. The tile's f16 scales follow all its quant blocks. Per 16 × 32
//!   weights that is 544 / 352 / 288 B, exactly the GGUF sizes; `n` is padded up to a multiple
//!   of 16 with zero-scale rows, never written to the output. This is the only copy kept:
//!   embeddings and the adapters that need the dense weight dequantize from it.
//! - **Numerics.** Each activation row is quantized to Q8_0 exactly like ggml/candle (`d = amax
//!   / 127`, `q = round(x / d)` with `1/d` from the unrounded `d`, `d` rounded through f16).
//!   Each output is then, over blocks in order, `acc = acc + (d_w · d_x) · Σ q_w q_x` in f32
//!   (two products and a sum, each rounded; no FMA), where the integer block dot is exact on
//!   every path. So every path (portable, AVX2, AVX-512 VNNI) gives the same bits, and a row's
//!   result does not depend on how many rows share the call: a prompt, a decode step, a batch
//!   of sessions and a prefix-cache hit all see the same logits. (Q5_0 and Q4_0 give the bits
//!   of the same blocks written as Q8_0.)
//! - **Paths.** AVX-512 VNNI: one `vpdpbusd` per 64 weight bytes gives the 16 outputs' partial
//!   sums in its lanes (the weights' bias is taken back by starting from `−bias · Σ q_x`; a
//!   nibble line is masked and shifted into two operands); up to 4 activation rows share each
//!   weight load. AMX (Sapphire Rapids and later, Linux; Q8_0 only): a tile block is already an
//!   AMX `B` operand, so groups of 16 activation rows take one `tdpbsud` per block and the same
//!   float steps (rows past the last full group go to VNNI); off with `EXPERT_RUNTIME_AMX=0`.
//!   AVX2: the same tile read as two 8-lane halves, `maddubs` (Q8_0: on `|q_w|` and `q_x` with
//!   `q_w`'s sign; Q5_0 / Q4_0: on `u` itself, at most 31). Portable: plain loops (any CPU, or
//!   `EXPERT_RUNTIME_SIMD=portable`). NEON (aarch64, `q8/neon.rs`): a tile's 16 outputs as 4
//!   vectors of 4 lanes, one SDOT per 16 weight bytes where the CPU has it ([`Path::NeonDot`]),
//!   widening multiplies otherwise ([`Path::Neon`]); 2 activation rows share each weight load.
//! - **Threads.** [`super::tiled`]: chunks of tiles on rayon, rows in groups of 64 per tile;
//!   the x86 kernels prefetch the weights 32 KiB ahead into L2 ([`tiled::Ahead`]), which a
//!   decode-sized product, bound by the weight stream, needs to come near a plain read.
//! - **Allocation.** Besides the output, only the quantized activations (a thread-local
//!   scratch reused across calls, or a fresh one if that scratch is already borrowed by a
//!   re-entrant call from rayon work stealing); chunks write their columns of the output
//!   directly.

use std::cell::RefCell;
use std::sync::OnceLock;

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;
use rayon::prelude::*;

use super::nibbles;
use super::tiled::{self, Ahead, PackedMatrix, Tiles, TN};
use crate::error::{EngineError, Result};
use crate::simd;

/// Q8_0 block length.
pub const QK: usize = 32;
const Q8_0_BYTES: usize = 2 + QK;
/// Quant bytes of one block column of a tile (8 lines of 64).
const TILE_Q: usize = TN * QK;
/// Scale bytes of one block column of a tile (16 f16).
const TILE_S: usize = TN * 2;

/// A kernel path of this module.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Path {
    Portable,
    /// x86-64 with AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// x86-64 with AVX-512 (F, BW, VL) and VNNI.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    /// [`Path::Avx512Vnni`] plus AMX-INT8 tiles for every full group of 16 activation rows.
    #[cfg(target_arch = "x86_64")]
    Amx,
    /// aarch64 NEON (every aarch64 CPU): widening multiplies for the integer dots.
    #[cfg(target_arch = "aarch64")]
    Neon,
    /// aarch64 NEON with SDOT (FEAT_DotProd).
    #[cfg(target_arch = "aarch64")]
    NeonDot,
}

/// The path this process runs (detected once; portable when `simd::level()` is). With
/// `EXPERT_RUNTIME_AMX=0` the AMX path is never chosen, and the OS is never asked for it.
pub fn path() -> Path {
    static PATH: OnceLock<Path> = OnceLock::new();
    *PATH.get_or_init(|| {
        if simd::forced_portable() {
            return Path::Portable;
        }
        let amx = std::env::var("EXPERT_RUNTIME_AMX").map_or(true, |v| v != "0");
        *paths_with(amx).last().expect("portable is always there")
    })
}

/// Every path this CPU can run, portable first (tests compare them).
pub fn paths() -> Vec<Path> {
    paths_with(true)
}

fn paths_with(#[allow(unused_variables)] amx: bool) -> Vec<Path> {
    #[allow(unused_mut)] // nothing is added off x86-64
    let mut v = vec![Path::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        if x86::has_avx2() {
            v.push(Path::Avx2);
        }
        if x86::has_vnni() {
            v.push(Path::Avx512Vnni);
        }
        if amx && x86::has_amx() {
            v.push(Path::Amx);
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        v.push(Path::Neon);
        if simd::neon::has_dotprod() {
            v.push(Path::NeonDot);
        }
    }
    v
}

/// Activation rows quantized to Q8_0: `q [rows, k]`, `d [rows, nb]` (f16-rounded scales as
/// f32) and `s [rows, nb] = Σ q` per block (the unsigned-weight paths start from `−bias · s`).
#[derive(Default)]
struct QuantRows {
    q: Vec<i8>,
    d: Vec<f32>,
    s: Vec<i32>,
}

impl QuantRows {
    fn fill(&mut self, x: &[f32], rows: usize, k: usize) {
        let nb = k / QK;
        self.q.resize(rows * k, 0);
        self.d.resize(rows * nb, 0.0);
        self.s.resize(rows * nb, 0);
        let one = |((q, d), s): ((&mut [i8], &mut [f32]), &mut [i32]), xr: &[f32]| {
            quantize_row(xr, q, d);
            for (sb, qb) in s.iter_mut().zip(q.chunks_exact(QK)) {
                *sb = qb.iter().map(|&v| v as i32).sum::<i32>();
            }
        };
        if rows == 1 {
            one(((&mut self.q[..], &mut self.d[..]), &mut self.s[..]), x);
        } else {
            self.q
                .par_chunks_mut(k)
                .zip(self.d.par_chunks_mut(nb))
                .zip(self.s.par_chunks_mut(nb))
                .zip(x.par_chunks(k))
                .for_each(|(parts, xr)| one(parts, xr));
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<QuantRows> = RefCell::new(QuantRows::default());
}

/// Quantizes `x` (`len = k`) to Q8_0 exactly as candle's `BlockQ8_0::from_float`; the scales
/// are returned already widened to f32 (the f16 rounding is kept).
fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    quantize_row_at(path(), x, q, d)
}

fn quantize_row_at(path: Path, x: &[f32], q: &mut [i8], d: &mut [f32]) {
    assert!(x.len().is_multiple_of(QK) && q.len() >= x.len() && d.len() >= x.len() / QK);
    match path {
        // SAFETY: the x86 paths are only constructed after AVX2 was detected; lengths asserted.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 | Path::Avx512Vnni | Path::Amx => unsafe { x86::quantize_row_avx2(x, q, d) },
        #[cfg(target_arch = "aarch64")]
        Path::Neon | Path::NeonDot => quantize_row_portable(x, q, d),
        Path::Portable => quantize_row_portable(x, q, d),
    }
}

/// Block scale as ggml computes it: `(d rounded through f16, 1/d from the unrounded d)`.
#[inline(always)]
fn block_scale(amax: f32) -> (f32, f32) {
    let s = amax / 127.0;
    let id = if s != 0.0 { 1.0 / s } else { 0.0 };
    (f16::from_f32(s).to_f32(), id)
}

fn quantize_row_portable(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    for (b, xs) in x.chunks_exact(QK).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (db, id) = block_scale(amax);
        d[b] = db;
        for (o, v) in q[b * QK..(b + 1) * QK].iter_mut().zip(xs) {
            *o = (v * id).round() as i8;
        }
    }
}

/// The block format of a packed matrix: blocks of 32 values with one f16 scale `d`, value
/// `d · (u − bias)` with `u` the unsigned integer stored in the tile.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Format {
    /// A block column is 8 lines of 64 bytes (line `j`: values `4j..4j+4` of each of the 16
    /// rows), `u = q + 128`.
    Q8_0,
    /// 4 lines of nibbles (line `p`: each row's 4 bytes hold values `8p..8p+4` in their low
    /// nibbles and `8p+4..8p+8` in their high nibbles), then one line of fifth bits (bit `2p`
    /// of a row's byte `i` for value `8p + i`, bit `2p + 1` for `8p + 4 + i`): `u ∈ 0..32`,
    /// bias 16, as ggml's Q5_0 stores it.
    Q5_0,
    /// The 4 nibble lines of [`Format::Q5_0`]: `u ∈ 0..16`, bias 8, as ggml's Q4_0.
    Q4_0,
}

impl Format {
    /// The format of a ggml block type, if this kernel runs it.
    pub fn of(dtype: GgmlDType) -> Option<Format> {
        match dtype {
            GgmlDType::Q8_0 => Some(Format::Q8_0),
            GgmlDType::Q5_0 => Some(Format::Q5_0),
            GgmlDType::Q4_0 => Some(Format::Q4_0),
            _ => None,
        }
    }

    pub fn dtype(self) -> GgmlDType {
        match self {
            Format::Q8_0 => GgmlDType::Q8_0,
            Format::Q5_0 => GgmlDType::Q5_0,
            Format::Q4_0 => GgmlDType::Q4_0,
        }
    }

    /// Quant bytes of one block column of a tile.
    fn tile_q(self) -> usize {
        match self {
            Format::Q8_0 => TILE_Q,
            Format::Q5_0 => nibbles::GROUP + nibbles::LINE,
            Format::Q4_0 => nibbles::GROUP,
        }
    }

    fn bias(self) -> i32 {
        match self {
            Format::Q8_0 => 128,
            Format::Q5_0 => 16,
            Format::Q4_0 => 8,
        }
    }

    /// Bytes of one ggml block.
    fn ggml_bytes(self) -> usize {
        match self {
            Format::Q8_0 => Q8_0_BYTES,
            Format::Q5_0 => 2 + 4 + QK / 2,
            Format::Q4_0 => 2 + QK / 2,
        }
    }

    /// The 32 stored integers `u` of one ggml block (`block_q8_0 { d; i8 qs[32] }`, `block_q5_0
    /// { d; u8 qh[4]; u8 qs[16] }`, `block_q4_0 { d; u8 qs[16] }`), and its scale bits.
    fn read_ggml(self, b: &[u8], u: &mut [u8; QK]) -> u16 {
        let d = u16::from_le_bytes([b[0], b[1]]);
        match self {
            Format::Q8_0 => u.iter_mut().zip(&b[2..]).for_each(|(o, &v)| *o = v ^ 0x80),
            // Value `j < 16`: the low nibble of byte `j`; `j + 16`: its high nibble.
            Format::Q5_0 => {
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let qs = &b[6..22];
                for j in 0..16 {
                    u[j] = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4) as u8;
                    u[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
                }
            }
            Format::Q4_0 => {
                let qs = &b[2..18];
                for j in 0..16 {
                    u[j] = qs[j] & 0x0F;
                    u[j + 16] = qs[j] >> 4;
                }
            }
        }
        d
    }
}

/// A `[n, k]` Q8_0, Q5_0 or Q4_0 weight repacked in 16-row tiles (see the module note and
/// [`Format`]).
pub struct Packed32 {
    tiles: Tiles,
    format: Format,
    n: usize,
    k: usize,
}

impl Packed32 {
    /// A zeroed matrix (every scale 0) for `[n, k]`.
    fn zeroed(format: Format, n: usize, k: usize) -> Result<Self> {
        let tiles = Tiles::zeroed(n, k, QK, format.tile_q() + TILE_S, &format!("{format:?}"))?;
        Ok(Self { tiles, format, n, k })
    }

    fn nb(&self) -> usize {
        self.k / QK
    }

    /// Tile `t`: its quant blocks (`nb × tile_q` B) and scales (`nb × 32` B).
    fn tile(&self, t: usize) -> (&[u8], &[u8]) {
        self.tiles.get(t).split_at(self.nb() * self.format.tile_q())
    }

    /// Writes row `lane` of a (zeroed) tile's block `b`: scale bits `d` and the 32 stored
    /// integers `u`.
    fn put(format: Format, tile: &mut [u8], nb: usize, lane: usize, b: usize, d: u16, u: &[u8; QK]) {
        let tq = format.tile_q();
        let (qs, ss) = tile.split_at_mut(nb * tq);
        ss[b * TILE_S + lane * 2..][..2].copy_from_slice(&d.to_le_bytes());
        let blk = &mut qs[b * tq..][..tq];
        match format {
            // Line `j` holds values 4j..4j+4 of each row ([`quant_at`]): 8 copies of 4 bytes.
            Format::Q8_0 => {
                for (j, four) in u.chunks_exact(4).enumerate() {
                    blk[quant_at(lane, 4 * j)..][..4].copy_from_slice(four);
                }
            }
            Format::Q5_0 | Format::Q4_0 => {
                let (lines, fifth) = blk.split_at_mut(nibbles::GROUP);
                nibbles::put_block(lines, (format == Format::Q5_0).then_some(fifth), lane, u);
            }
        }
    }

    /// Row `lane`'s stored integer `i` (0..32) of a tile's block.
    #[inline]
    fn stored(format: Format, blk: &[u8], lane: usize, i: usize) -> u8 {
        match format {
            Format::Q8_0 => blk[quant_at(lane, i)],
            Format::Q5_0 | Format::Q4_0 => {
                let (lines, fifth) = blk.split_at(nibbles::GROUP);
                nibbles::get(lines, (format == Format::Q5_0).then_some(fifth), lane, i)
            }
        }
    }

    /// Quantizes a `[n, k]` matrix straight into the packed Q8_0 layout (quantize on load):
    /// `row(r, out)` writes row `r` in f32 into `out` (`len = k`). The blocks are those of
    /// [`quantize_row`] (candle's and ggml's Q8_0 quantizer), so the result equals
    /// [`Self::from_qtensor`] of the same matrix quantized by candle. Tiles run in parallel; a
    /// failing `row` fails the whole.
    pub fn from_rows(n: usize, k: usize, row: impl Fn(usize, &mut [f32]) -> Result<()> + Sync) -> Result<Self> {
        let mut p = Self::zeroed(Format::Q8_0, n, k)?;
        let nb = p.nb();
        p.tiles.par_mut().enumerate().try_for_each_init(
            || (vec![0f32; k], vec![0i8; k], vec![0f32; nb]),
            |(x, q, d), (t, tile)| -> Result<()> {
                let mut u = [0u8; QK];
                for lane in 0..TN.min(n - t * TN) {
                    row(t * TN + lane, x)?;
                    quantize_row(x, q, d);
                    for b in 0..nb {
                        u.iter_mut().zip(&q[b * QK..(b + 1) * QK]).for_each(|(o, &v)| *o = (v as u8) ^ 0x80);
                        Self::put(Format::Q8_0, tile, nb, lane, b, f16::from_f32(d[b]).to_bits(), &u);
                    }
                }
                Ok(())
            },
        )?;
        Ok(p)
    }

    /// Repacks a 2-D Q8_0, Q5_0 or Q4_0 `QTensor` of shape `[n, k]`.
    pub fn from_qtensor(q: &QTensor) -> Result<Self> {
        let format = Format::of(q.dtype())
            .ok_or_else(|| EngineError::InvalidModel(format!("Packed32 needs Q8_0, Q5_0 or Q4_0, got {:?}", q.dtype())))?;
        let (n, k) = q.shape().dims2()?;
        Self::from_ggml_bytes(format, &q.data()?, n, k)
    }

    /// Repacks raw ggml blocks (row-major, `k / 32` blocks per row).
    pub fn from_ggml_bytes(format: Format, bytes: &[u8], n: usize, k: usize) -> Result<Self> {
        let mut p = Self::zeroed(format, n, k)?;
        let (nb, gb) = (p.nb(), format.ggml_bytes());
        if nb.checked_mul(gb).and_then(|row| n.checked_mul(row)) != Some(bytes.len()) {
            return Err(EngineError::InvalidModel(format!(
                "{} bytes of {format:?} do not make a [{n}, {k}] matrix",
                bytes.len()
            )));
        }
        p.tiles.par_mut().enumerate().for_each(|(t, tile)| {
            let mut u = [0u8; QK];
            for lane in 0..TN.min(n - t * TN) {
                for b in 0..nb {
                    let d = format.read_ggml(&bytes[((t * TN + lane) * nb + b) * gb..][..gb], &mut u);
                    Self::put(format, tile, nb, lane, b, d, &u);
                }
            }
        });
        Ok(p)
    }

    /// Repacks raw GGUF Q8_0 blocks (row-major, `k / 32` blocks per row).
    pub fn from_q8_0_bytes(bytes: &[u8], n: usize, k: usize) -> Result<Self> {
        Self::from_ggml_bytes(Format::Q8_0, bytes, n, k)
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// Bytes held (the tiles, with their padding rows).
    pub fn size_in_bytes(&self) -> usize {
        self.tiles.size_in_bytes()
    }

    /// The packed tiles, for tests that compare two packings byte for byte.
    #[cfg(test)]
    pub(super) fn tile_bytes(&self) -> Vec<u8> {
        (0..self.tiles.count()).flat_map(|t| self.tiles.get(t).to_vec()).collect()
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
        // AMX multiplies 8-bit weights only: the nibble formats take the VNNI path there.
        #[cfg(target_arch = "x86_64")]
        let path = if path == Path::Amx && self.format != Format::Q8_0 { Path::Avx512Vnni } else { path };
        // SAFETY: the AMX path is only constructed after `has_amx`.
        #[cfg(target_arch = "x86_64")]
        let chunk_state = || (path == Path::Amx && rows >= 16).then(|| unsafe { x86::Tiles::configure() });
        #[cfg(not(target_arch = "x86_64"))]
        let chunk_state = || ();
        tiled::run(self.n, &self.tiles, rows, out, chunk_state, |_, t, rows, part, ahead| {
            let (qs, ss) = self.tile(t);
            tile_rows(path, self.format, qs, ss, self.nb(), xs, self.k, rows, part, ahead);
        });
    }
}

impl PackedMatrix for Packed32 {
    fn rows(&self) -> usize {
        self.n
    }

    fn cols(&self) -> usize {
        self.k
    }

    /// `(u − bias) · d`, as candle's `to_float`.
    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.n && out.len() == self.k);
        let (qs, ss) = self.tile(r / TN);
        let (lane, tq, bias) = (r % TN, self.format.tile_q(), self.format.bias());
        for (b, o) in out.chunks_exact_mut(QK).enumerate() {
            let d = scale(ss, b, lane);
            let blk = &qs[b * tq..][..tq];
            for (i, v) in o.iter_mut().enumerate() {
                *v = (Self::stored(self.format, blk, lane, i) as i32 - bias) as f32 * d;
            }
        }
    }

    /// Each row quantized to Q8_0 first (candle's `QMatMul` semantics; see the module note).
    fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        self.matmul_at(path(), x, rows, out)
    }
}

/// Byte of row `lane`'s quant `i` (0..32) within a tile's block: line `i / 4`, then the lane's
/// 4 bytes.
#[inline(always)]
fn quant_at(lane: usize, i: usize) -> usize {
    (i / 4) * 64 + lane * 4 + i % 4
}

/// Scale of `lane` in block `b` of a tile's scales.
#[inline]
fn scale(ss: &[u8], b: usize, lane: usize) -> f32 {
    f16::from_le_bytes([ss[b * TILE_S + lane * 2], ss[b * TILE_S + lane * 2 + 1]]).to_f32()
}

/// One tile against activation rows `rows` of `xs`: `out[i]` gets row `rows.start + i`'s 16
/// outputs.
#[allow(clippy::too_many_arguments)]
fn tile_rows(
    path: Path,
    format: Format,
    qs: &[u8],
    ss: &[u8],
    nb: usize,
    xs: &QuantRows,
    k: usize,
    rows: std::ops::Range<usize>,
    out: &mut [[f32; TN]],
    ahead: Ahead,
) {
    assert!(qs.len() == nb * format.tile_q() && ss.len() == nb * TILE_S && out.len() == rows.len());
    assert!(xs.q.len() >= rows.end * k && xs.d.len() >= rows.end * nb && xs.s.len() >= rows.end * nb && k == nb * QK);
    match path {
        // SAFETY: each x86 path is only constructed after its features were detected (and AMX
        // only runs Q8_0); the asserts above bound every pointer the kernels read (see their
        // notes).
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Vnni => unsafe { x86::rows_vnni(format, qs, ss, nb, xs, k, rows.start, out, ahead) },
        #[cfg(target_arch = "x86_64")]
        Path::Amx => unsafe { x86::rows_amx(qs, ss, nb, xs, k, rows.start, out, ahead) },
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { x86::rows_avx2(format, qs, ss, nb, xs, k, rows.start, out, ahead) },
        // SAFETY: `NeonDot` is only constructed after SDOT was detected; the asserts above
        // bound every pointer the kernels read.
        #[cfg(target_arch = "aarch64")]
        Path::Neon => unsafe { neon::rows::<false>(format, qs, ss, nb, xs, k, rows.start, out) },
        #[cfg(target_arch = "aarch64")]
        Path::NeonDot => unsafe { neon::rows::<true>(format, qs, ss, nb, xs, k, rows.start, out) },
        Path::Portable => {
            let _ = ahead;
            for (r, o) in rows.zip(out) {
                tile_row_portable(format, qs, ss, nb, &xs.q[r * k..(r + 1) * k], &xs.d[r * nb..(r + 1) * nb], o);
            }
        }
    }
}

/// The reference arithmetic: per output, blocks in order, `acc + (d_w · d_x) · Σ q_w q_x`.
fn tile_row_portable(format: Format, qs: &[u8], ss: &[u8], nb: usize, xq: &[i8], xd: &[f32], out: &mut [f32; TN]) {
    let (tq, bias) = (format.tile_q(), format.bias());
    let mut acc = [0f32; TN];
    for b in 0..nb {
        let blk = &qs[b * tq..][..tq];
        let xb = &xq[b * QK..][..QK];
        let mut isum = [0i32; TN];
        match format {
            // Line by line (the layout's order, contiguous reads): line `j` holds quants
            // `4j..4j+4` of each lane, as `quant_at` places them.
            Format::Q8_0 => {
                for (j, line) in blk.chunks_exact(64).enumerate() {
                    for (lane, s) in isum.iter_mut().enumerate() {
                        for i in 0..4 {
                            *s += ((line[lane * 4 + i] ^ 0x80) as i8 as i32) * xb[j * 4 + i] as i32;
                        }
                    }
                }
            }
            Format::Q5_0 | Format::Q4_0 => {
                let (lines, fifth) = blk.split_at(nibbles::GROUP);
                let fifth = if format == Format::Q5_0 { fifth } else { &[0u8; nibbles::LINE][..] };
                for (p, line) in lines.chunks_exact(nibbles::LINE).enumerate() {
                    for (lane, s) in isum.iter_mut().enumerate() {
                        for i in 0..4 {
                            let (lo, hi) = nibbles::pair(line[lane * 4 + i], fifth[lane * 4 + i], p);
                            *s += (lo as i32 - bias) * xb[8 * p + i] as i32 + (hi as i32 - bias) * xb[8 * p + 4 + i] as i32;
                        }
                    }
                }
            }
        }
        for (lane, a) in acc.iter_mut().enumerate() {
            *a += scale(ss, b, lane) * xd[b] * isum[lane] as f32;
        }
    }
    *out = acc;
}

#[cfg(target_arch = "aarch64")]
mod neon;

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;
