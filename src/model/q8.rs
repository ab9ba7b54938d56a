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
            Format::Q5_0 => {
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                for j in 0..QK {
                    let nibble = (b[6 + j % 16] >> (4 * (j / 16))) & 0x0F;
                    u[j] = nibble | (((qh >> j) & 1) << 4) as u8;
                }
            }
            Format::Q4_0 => (0..QK).for_each(|j| u[j] = (b[2 + j % 16] >> (4 * (j / 16))) & 0x0F),
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
        for (i, &v) in u.iter().enumerate() {
            match format {
                Format::Q8_0 => blk[quant_at(lane, i)] = v,
                Format::Q5_0 | Format::Q4_0 => {
                    let (lines, fifth) = blk.split_at_mut(nibbles::GROUP);
                    nibbles::put(lines, (format == Format::Q5_0).then_some(fifth), lane, i, v);
                }
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
mod x86 {
    use super::{nibbles, Ahead, Format, QuantRows, QK, TILE_Q, TILE_S, TN};
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    /// What [`super::Path::Avx2`] needs.
    pub(super) fn has_avx2() -> bool {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c")
    }

    /// What [`super::Path::Avx512Vnni`] needs (its quantizer is the AVX2 one).
    pub(super) fn has_vnni() -> bool {
        has_avx2()
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vnni")
    }

    /// What [`super::Path::Amx`] needs: the VNNI path (tails of fewer than 16 rows and single
    /// rows run there), AMX-TILE and AMX-INT8 in CPUID, and the OS's leave to use tile data.
    /// Linux grants it per process through `arch_prctl(ARCH_REQ_XCOMP_PERM)` and refuses when
    /// the kernel or a thread's signal stack cannot hold the tile state; without that grant a
    /// tile instruction would kill the process, so the path stays off. Other systems: off.
    pub(super) fn has_amx() -> bool {
        static OK: OnceLock<bool> = OnceLock::new();
        *OK.get_or_init(|| {
            // CPUID leaf 7, sub-leaf 0: EDX bit 24 is AMX-TILE, bit 25 AMX-INT8.
            let leaf7 = __cpuid_count(7, 0);
            has_vnni() && leaf7.edx & (1 << 24) != 0 && leaf7.edx & (1 << 25) != 0 && os_allows_tiles()
        })
    }

    #[cfg(target_os = "linux")]
    fn os_allows_tiles() -> bool {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: integer arguments only; it changes nothing but this process's permission.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    }

    #[cfg(not(target_os = "linux"))]
    fn os_allows_tiles() -> bool {
        false
    }

    /// The `ldtilecfg` operand (palette 1): per tile register, bytes per row and rows.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    /// `tmm0`–`tmm3`: 16 × 16 i32 sums (C, two sets of two); `tmm4`, `tmm5`: 16 activation rows
    /// × one block of 32 i8 (A); `tmm6`, `tmm7`: one block of a weight tile, 8 lines × 64 u8 (B,
    /// the packed layout as it is).
    ///
    /// # Safety
    /// [`has_amx`] must have returned true.
    unsafe fn configure_tiles() {
        let mut cfg = TileConfig { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
        for (t, (colsb, rows)) in
            [(64, 16), (64, 16), (64, 16), (64, 16), (32, 16), (32, 16), (64, 8), (64, 8)].into_iter().enumerate()
        {
            cfg.colsb[t] = colsb;
            cfg.rows[t] = rows;
        }
        asm!("ldtilecfg [{cfg}]", cfg = in(reg) &cfg, options(nostack, readonly));
    }

    thread_local! {
        static CONFIGURED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// This thread's tile registers configured for [`amx16`] while the value lives; inner scopes
    /// reuse the outer one's configuration (loading it costs hundreds of cycles), and every
    /// outermost scope loads it again, whatever else ran on the thread in between. The tiles
    /// are left configured on drop rather than released (`tilerelease`): other code may cache
    /// its own configuration per thread (candle's AMX path does), and a released tile state
    /// would make its next tile instruction fault.
    pub(super) struct Tiles {
        outermost: bool,
    }

    impl Tiles {
        /// # Safety
        /// [`has_amx`] must have returned true.
        pub(super) unsafe fn configure() -> Tiles {
            let outermost = !CONFIGURED.get();
            if outermost {
                configure_tiles();
                CONFIGURED.set(true);
            }
            Tiles { outermost }
        }
    }

    impl Drop for Tiles {
        fn drop(&mut self) {
            if self.outermost {
                CONFIGURED.set(false);
            }
        }
    }

    /// Rows from `r0` against one tile: groups of 16 on AMX, the rest on VNNI (same bits).
    ///
    /// # Safety
    /// [`has_amx`] must have returned true; slices as for `rows_vnni`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn rows_amx(
        qs: &[u8],
        ss: &[u8],
        nb: usize,
        xs: &QuantRows,
        k: usize,
        r0: usize,
        out: &mut [[f32; TN]],
        ahead: Ahead,
    ) {
        let full = out.len() / 16 * 16;
        if full > 0 {
            let _tiles = Tiles::configure();
            for (i, o) in out[..full].chunks_exact_mut(16).enumerate() {
                amx16(qs, ss, nb, xs, k, r0 + i * 16, o);
            }
        }
        // The VNNI rows come after `full / 16` AMX passes: with none (decode) they stream the
        // tile and prefetch.
        rows_vnni(Format::Q8_0, qs, ss, nb, xs, k, r0 + full, &mut out[full..], ahead.for_pass(full / 16));
    }

    /// One block's sums for 16 rows, as `tilestored` writes them: row `r`, then its 16 lanes.
    #[repr(C, align(64))]
    struct Sums([[i32; TN]; 16]);

    /// 16 rows from `r0` against one tile. Per block, `tdpbsud` gives `Σ q_x · (q_w + 128)`
    /// for the 16 rows × 16 lanes (activations signed in A, the biased weights unsigned in B);
    /// adding the row's `-128 · Σ q_x` leaves `Σ q_x q_w`, the same exact integer as the
    /// other paths, and the float steps are `rows_vnni`'s.
    ///
    /// Blocks go in pairs, software-pipelined over two sets of sum tiles: while the vector
    /// units fold pair `p - 1` into the accumulators, the tile unit multiplies pair `p` (tile
    /// registers are not renamed, so one set would serialise the two). An odd last block is
    /// paired with itself and its copy is not folded.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn amx16(qs: &[u8], ss: &[u8], nb: usize, xs: &QuantRows, k: usize, r0: usize, out: &mut [[f32; TN]]) {
        let mut acc = [_mm512_setzero_ps(); 16];
        let mut sums = [[Sums([[0; TN]; 16]), Sums([[0; TN]; 16])], [Sums([[0; TN]; 16]), Sums([[0; TN]; 16])]];
        let xq = xs.q.as_ptr().add(r0 * k);
        let pairs = nb.div_ceil(2);
        let issue = |p: usize| {
            let (b0, b1) = (2 * p, (2 * p + 1).min(nb - 1));
            multiply_pair(p % 2, xq.add(b0 * QK), xq.add(b1 * QK), k, qs.as_ptr().add(b0 * TILE_Q), qs.as_ptr().add(b1 * TILE_Q));
        };
        issue(0);
        for p in 0..pairs {
            let [s0, s1] = &mut sums[p % 2];
            store_pair(p % 2, s0, s1);
            if p + 1 < pairs {
                issue(p + 1);
            }
            fold16(&mut acc, s0, ss, nb, xs, r0, 2 * p);
            if 2 * p + 1 < nb {
                fold16(&mut acc, s1, ss, nb, xs, r0, 2 * p + 1);
            }
        }
        for (a, o) in acc.iter().zip(out.iter_mut()) {
            _mm512_storeu_ps(o.as_mut_ptr(), *a);
        }
    }

    /// Sum tiles of `set` (`tmm0, tmm1` or `tmm2, tmm3`) = A · B for two blocks: 16 activation
    /// rows of 32 bytes at `a0` / `a1` (row stride `k`), a weight block of 8 lines × 64 at `w0` /
    /// `w1`.
    #[inline(always)]
    unsafe fn multiply_pair(set: usize, a0: *const i8, a1: *const i8, k: usize, w0: *const u8, w1: *const u8) {
        macro_rules! pair {
            ($c0:literal, $c1:literal) => {
                asm!(
                    concat!("tilezero ", $c0),
                    concat!("tilezero ", $c1),
                    "tileloadd tmm4, [{a0} + {k} * 1]",
                    "tileloadd tmm6, [{w0} + {line} * 1]",
                    concat!("tdpbsud ", $c0, ", tmm4, tmm6"),
                    "tileloadd tmm5, [{a1} + {k} * 1]",
                    "tileloadd tmm7, [{w1} + {line} * 1]",
                    concat!("tdpbsud ", $c1, ", tmm5, tmm7"),
                    a0 = in(reg) a0, a1 = in(reg) a1, k = in(reg) k, w0 = in(reg) w0, w1 = in(reg) w1,
                    line = in(reg) 64usize, options(nostack, readonly),
                )
            };
        }
        if set == 0 {
            pair!("tmm0", "tmm1")
        } else {
            pair!("tmm2", "tmm3")
        }
    }

    /// Stores the sum tiles of `set` (see [`multiply_pair`]).
    #[inline(always)]
    unsafe fn store_pair(set: usize, s0: &mut Sums, s1: &mut Sums) {
        let (p0, p1) = (s0.0.as_mut_ptr(), s1.0.as_mut_ptr());
        if set == 0 {
            asm!("tilestored [{p0} + {line} * 1], tmm0", "tilestored [{p1} + {line} * 1], tmm1",
                 p0 = in(reg) p0, p1 = in(reg) p1, line = in(reg) 64usize, options(nostack));
        } else {
            asm!("tilestored [{p0} + {line} * 1], tmm2", "tilestored [{p1} + {line} * 1], tmm3",
                 p0 = in(reg) p0, p1 = in(reg) p1, line = in(reg) 64usize, options(nostack));
        }
    }

    /// The sum of a row's `C` accumulator chains (independent `vpdpbusd` chains, so one does
    /// not wait on the latency of the last; integer sums, exact in any order).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn chains<const C: usize>(c: [__m512i; C]) -> __m512i {
        c[1..].iter().fold(c[0], |a, &v| _mm512_add_epi32(a, v))
    }

    /// One block folded into a row's 16 outputs: `acc + (d_w · d_x) · isum`, two products and a
    /// sum, each rounded (the float steps of the module note, shared by the VNNI and AMX paths).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn scale_add(acc: __m512, dw: __m512, dx: f32, isum: __m512i) -> __m512 {
        _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(dw, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(isum)))
    }

    /// Folds block `b`'s sums of 16 rows from `r0` into their accumulators with
    /// [`scale_add`] after adding `-128 · Σ q_x`. Unrolled so the accumulators stay in registers.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn fold16(acc: &mut [__m512; 16], sums: &Sums, ss: &[u8], nb: usize, xs: &QuantRows, r0: usize, b: usize) {
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(ss.as_ptr().add(b * TILE_S) as *const __m256i));
        let (s, d) = (xs.s.as_ptr().add(r0 * nb + b), xs.d.as_ptr().add(r0 * nb + b));
        macro_rules! row {
            ($($r:literal)*) => {$(
                let isum = _mm512_add_epi32(_mm512_load_si512(sums.0[$r].as_ptr() as *const _), _mm512_set1_epi32(-128 * *s.add($r * nb)));
                acc[$r] = scale_add(acc[$r], dw, *d.add($r * nb), isum);
            )*};
        }
        row!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    }

    /// [`super::quantize_row_portable`] in AVX2, bit for bit: `f32::max` ignores NaN (so does
    /// `max_ps` with the new value first), rounding is half away from zero, and the `as i8`
    /// conversion saturates and sends NaN to 0.
    ///
    /// # Safety
    /// AVX2 must be present; `x.len()` a multiple of 32, `q.len() >= x.len()`, `d.len() >=
    /// x.len() / 32` (asserted by the caller).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_row_avx2(x: &[f32], q: &mut [i8], d: &mut [f32]) {
        let sign = _mm256_set1_ps(-0.0);
        let half = _mm256_set1_ps(0.5);
        let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
        for b in 0..x.len() / QK {
            let p = x.as_ptr().add(b * QK);
            let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
            let mut m = _mm256_setzero_ps();
            for vi in v {
                m = _mm256_max_ps(_mm256_andnot_ps(sign, vi), m);
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let m1 = _mm_max_ss(m2, _mm_movehdup_ps(m2));
            let (db, id) = super::block_scale(_mm_cvtss_f32(m1));
            *d.get_unchecked_mut(b) = db;
            let idv = _mm256_set1_ps(id);
            let mut ints = [_mm256_setzero_si256(); 4];
            for (i, vi) in v.into_iter().enumerate() {
                let y = _mm256_mul_ps(vi, idv);
                // Half away from zero: nearest-even, except exact halves go to trunc ± 1.
                let t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(y, t));
                let away = _mm256_add_ps(t, _mm256_or_ps(_mm256_and_ps(y, sign), _mm256_set1_ps(1.0)));
                let near = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                let r = _mm256_blendv_ps(near, away, _mm256_cmp_ps(frac, half, _CMP_EQ_OQ));
                // NaN → 0, then saturate to the i8 range.
                let r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q));
                ints[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
            }
            let w01 = _mm256_packs_epi32(ints[0], ints[1]);
            let w23 = _mm256_packs_epi32(ints[2], ints[3]);
            let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(q.as_mut_ptr().add(b * QK) as *mut __m256i, bytes);
        }
    }

    /// Rows from `r0` (`out.len()` of them) against one tile, 4 sharing each weight load.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL and VNNI must be present; `qs`, `ss`, `out` and `xs` as asserted by
    /// `super::tile_rows` (every read below is inside them).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn rows_vnni(
        format: Format,
        qs: &[u8],
        ss: &[u8],
        nb: usize,
        xs: &QuantRows,
        k: usize,
        r0: usize,
        out: &mut [[f32; TN]],
        ahead: Ahead,
    ) {
        for (i, o) in out.chunks_mut(4).enumerate() {
            let r = r0 + i * 4;
            let a = ahead.for_pass(i);
            macro_rules! rows {
                ($f:ident $(, $hi:literal)?) => {
                    match o.len() {
                        4 => $f::<4, 2 $(, $hi)?>(qs, ss, nb, xs, k, r, o, a),
                        3 => $f::<3, 2 $(, $hi)?>(qs, ss, nb, xs, k, r, o, a),
                        2 => $f::<2, 2 $(, $hi)?>(qs, ss, nb, xs, k, r, o, a),
                        _ => $f::<1, 4 $(, $hi)?>(qs, ss, nb, xs, k, r, o, a),
                    }
                };
            }
            match format {
                Format::Q8_0 => rows!(vnni),
                Format::Q5_0 => rows!(vnni_nibbles, true),
                Format::Q4_0 => rows!(vnni_nibbles, false),
            }
        }
    }

    /// `R` rows from `r0` against one Q4_0 (`HI = false`) or Q5_0 tile: per line of nibbles
    /// two `vpdpbusd` (the fifth bits moved to bit 4 by 16-bit shifts of at most 4 left or 3
    /// right, which never carry another byte's bit there), from `−bias · Σ q_x`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn vnni_nibbles<const R: usize, const C: usize, const HI: bool>(
        qs: &[u8],
        ss: &[u8],
        nb: usize,
        xs: &QuantRows,
        k: usize,
        r0: usize,
        out: &mut [[f32; TN]],
        ahead: Ahead,
    ) {
        let format = if HI { Format::Q5_0 } else { Format::Q4_0 };
        let (tq, bias) = (format.tile_q(), format.bias());
        let mut acc = [_mm512_setzero_ps(); R];
        let xq = xs.q.as_ptr().add(r0 * k);
        for b in 0..nb {
            let mut isum = [[_mm512_setzero_si512(); C]; R];
            for (r, s) in isum.iter_mut().enumerate() {
                s[0] = _mm512_set1_epi32(-bias * *xs.s.get_unchecked((r0 + r) * nb + b));
            }
            let blk = qs.as_ptr().add(b * tq);
            ahead.fetch(qs.as_ptr().add(b * (tq + TILE_S)), tq + TILE_S);
            let qh = if HI { _mm512_loadu_si512(blk.add(nibbles::GROUP) as *const _) } else { _mm512_setzero_si512() };
            macro_rules! line {
                ($p:literal) => {{
                    let w = _mm512_loadu_si512(blk.add($p * 64) as *const _);
                    let (lo, hi) = nibbles::x86::vnni_operands::<HI>(w, qh, $p);
                    let (cl, ch) = ((2 * $p) % C, (2 * $p + 1) % C);
                    for (r, s) in isum.iter_mut().enumerate() {
                        let x = xq.add(r * k + b * QK + $p * 8);
                        s[cl] = _mm512_dpbusd_epi32(s[cl], lo, _mm512_set1_epi32(std::ptr::read_unaligned(x as *const i32)));
                        s[ch] =
                            _mm512_dpbusd_epi32(s[ch], hi, _mm512_set1_epi32(std::ptr::read_unaligned(x.add(4) as *const i32)));
                    }
                }};
            }
            line!(0);
            line!(1);
            line!(2);
            line!(3);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(ss.as_ptr().add(b * TILE_S) as *const __m256i));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = scale_add(*a, dw, *xs.d.get_unchecked((r0 + r) * nb + b), chains(isum[r]));
            }
        }
        for (a, o) in acc.iter().zip(out.iter_mut()) {
            _mm512_storeu_ps(o.as_mut_ptr(), *a);
        }
    }

    /// `R` rows from `r0` against one tile.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn vnni<const R: usize, const C: usize>(
        qs: &[u8],
        ss: &[u8],
        nb: usize,
        xs: &QuantRows,
        k: usize,
        r0: usize,
        out: &mut [[f32; TN]],
        ahead: Ahead,
    ) {
        let mut acc = [_mm512_setzero_ps(); R];
        let xq = xs.q.as_ptr().add(r0 * k);
        for b in 0..nb {
            ahead.fetch(qs.as_ptr().add(b * (TILE_Q + TILE_S)), TILE_Q + TILE_S);
            let mut isum = [[_mm512_setzero_si512(); C]; R];
            for (r, s) in isum.iter_mut().enumerate() {
                s[0] = _mm512_set1_epi32(-128 * *xs.s.get_unchecked((r0 + r) * nb + b));
            }
            let blk = qs.as_ptr().add(b * TILE_Q);
            for j in 0..8 {
                let w = _mm512_loadu_si512(blk.add(j * 64) as *const _);
                for (r, s) in isum.iter_mut().enumerate() {
                    let quad = std::ptr::read_unaligned(xq.add(r * k + b * QK + j * 4) as *const i32);
                    s[j % C] = _mm512_dpbusd_epi32(s[j % C], w, _mm512_set1_epi32(quad));
                }
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(ss.as_ptr().add(b * TILE_S) as *const __m256i));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = scale_add(*a, dw, *xs.d.get_unchecked((r0 + r) * nb + b), chains(isum[r]));
            }
        }
        for (a, o) in acc.iter().zip(out.iter_mut()) {
            _mm512_storeu_ps(o.as_mut_ptr(), *a);
        }
    }

    /// Rows from `r0` (`out.len()` of them) against one tile, 2 sharing each weight load.
    ///
    /// # Safety
    /// AVX2 and F16C must be present; slices as for `rows_vnni`.
    #[target_feature(enable = "avx2,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn rows_avx2(
        format: Format,
        qs: &[u8],
        ss: &[u8],
        nb: usize,
        xs: &QuantRows,
        k: usize,
        r0: usize,
        out: &mut [[f32; TN]],
        ahead: Ahead,
    ) {
        for (i, o) in out.chunks_mut(2).enumerate() {
            let r = r0 + i * 2;
            let a = ahead.for_pass(i);
            match (format, o.len()) {
                (Format::Q8_0, 2) => avx2::<2>(qs, ss, nb, xs, k, r, o, a),
                (Format::Q8_0, _) => avx2::<1>(qs, ss, nb, xs, k, r, o, a),
                (_, 2) => avx2_nibbles::<2>(format, qs, ss, nb, xs, k, r, o, a),
                (_, _) => avx2_nibbles::<1>(format, qs, ss, nb, xs, k, r, o, a),
            }
        }
    }

    /// `R` rows from `r0` against one Q4_0 or Q5_0 tile, as two halves of 8 lanes: `maddubs`
    /// on the unsigned stored integers (a line's two results, each at most `2 · 31 · 128`, are
    /// added as `i16`), from `−bias · Σ q_x`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn avx2_nibbles<const R: usize>(
        format: Format,
        qs: &[u8],
        ss: &[u8],
        nb: usize,
        xs: &QuantRows,
        k: usize,
        r0: usize,
        out: &mut [[f32; TN]],
        ahead: Ahead,
    ) {
        let (tq, bias) = (format.tile_q(), format.bias());
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let xq = xs.q.as_ptr().add(r0 * k);
        for b in 0..nb {
            ahead.fetch(qs.as_ptr().add(b * (tq + TILE_S)), tq + TILE_S);
            let blk = qs.as_ptr().add(b * tq);
            for h in 0..2 {
                let mut isum = [_mm256_setzero_si256(); R];
                for (r, s) in isum.iter_mut().enumerate() {
                    *s = _mm256_set1_epi32(-bias * *xs.s.get_unchecked((r0 + r) * nb + b));
                }
                let fifth = format == Format::Q5_0;
                let qh = if fifth {
                    _mm256_loadu_si256(blk.add(nibbles::GROUP + h * 32) as *const __m256i)
                } else {
                    _mm256_setzero_si256()
                };
                for p in 0..4 {
                    let w = _mm256_loadu_si256(blk.add(p * 64 + h * 32) as *const __m256i);
                    let (lo, hi) = nibbles::x86::avx2_operands(w, qh, p, fifth);
                    for (r, s) in isum.iter_mut().enumerate() {
                        let x = xq.add(r * k + b * QK + p * 8);
                        let pairs = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, _mm256_set1_epi32(std::ptr::read_unaligned(x as *const i32))),
                            _mm256_maddubs_epi16(hi, _mm256_set1_epi32(std::ptr::read_unaligned(x.add(4) as *const i32))),
                        );
                        *s = _mm256_add_epi32(*s, _mm256_madd_epi16(pairs, ones));
                    }
                }
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(ss.as_ptr().add(b * TILE_S + h * 16) as *const __m128i));
                for (r, a) in acc.iter_mut().enumerate() {
                    let d = _mm256_mul_ps(dw, _mm256_set1_ps(*xs.d.get_unchecked((r0 + r) * nb + b)));
                    a[h] = _mm256_add_ps(a[h], _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[r])));
                }
            }
        }
        for (a, o) in acc.iter().zip(out.iter_mut()) {
            _mm256_storeu_ps(o.as_mut_ptr(), a[0]);
            _mm256_storeu_ps(o.as_mut_ptr().add(8), a[1]);
        }
    }

    #[inline]
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn avx2<const R: usize>(
        qs: &[u8],
        ss: &[u8],
        nb: usize,
        xs: &QuantRows,
        k: usize,
        r0: usize,
        out: &mut [[f32; TN]],
        ahead: Ahead,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let xq = xs.q.as_ptr().add(r0 * k);
        let bias = _mm256_set1_epi8(-128);
        let ones = _mm256_set1_epi16(1);
        for b in 0..nb {
            ahead.fetch(qs.as_ptr().add(b * (TILE_Q + TILE_S)), TILE_Q + TILE_S);
            let mut isum = [[_mm256_setzero_si256(); 2]; R];
            let blk = qs.as_ptr().add(b * TILE_Q);
            for j in 0..8 {
                for h in 0..2 {
                    let w = _mm256_xor_si256(_mm256_loadu_si256(blk.add(j * 64 + h * 32) as *const __m256i), bias);
                    let aw = _mm256_sign_epi8(w, w);
                    for (r, s) in isum.iter_mut().enumerate() {
                        let quad = std::ptr::read_unaligned(xq.add(r * k + b * QK + j * 4) as *const i32);
                        let sx = _mm256_sign_epi8(_mm256_set1_epi32(quad), w);
                        // |q_w| ≤ 128 and |q_x| ≤ 127: a pair sum is at most 32512, no saturation.
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
                        s[h] = _mm256_add_epi32(s[h], p);
                    }
                }
            }
            for h in 0..2 {
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(ss.as_ptr().add(b * TILE_S + h * 16) as *const __m128i));
                for (r, a) in acc.iter_mut().enumerate() {
                    let d = _mm256_mul_ps(dw, _mm256_set1_ps(*xs.d.get_unchecked((r0 + r) * nb + b)));
                    a[h] = _mm256_add_ps(a[h], _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[r][h])));
                }
            }
        }
        for (a, o) in acc.iter().zip(out.iter_mut()) {
            _mm256_storeu_ps(o.as_mut_ptr(), a[0]);
            _mm256_storeu_ps(o.as_mut_ptr().add(8), a[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QMatMul;
    use candle_core::{Device, Module, Tensor};

    /// Per output: the exact product (f64) of the dequantized weight row and the quantized
    /// activation `q · d` (what every path of our kernel computes before rounding), and the
    /// bound on its f32 rounding: each block term `(d_w · d_x) · Σ q_w q_x` (the integer sum
    /// is exact) takes two roundings and the sum of `nb` terms at most `nb - 1` more, so
    /// `|ours - exact| ≤ γ_{nb+2} Σ |term|` with `γ_m ≈ m · u`, `u = 2⁻²⁴` (we allow `m · 2u`).
    fn exact_with_bound(deq: &[f32], k: usize, xq: &[i8], xd: &[f32]) -> Vec<(f64, f64)> {
        let nb = k / QK;
        deq.chunks_exact(k)
            .map(|w| {
                let (mut sum, mut abs) = (0f64, 0f64);
                for (b, &d) in xd.iter().enumerate().take(nb) {
                    let t: f64 = (b * QK..(b + 1) * QK).map(|j| w[j] as f64 * xq[j] as f64).sum::<f64>() * d as f64;
                    sum += t;
                    abs += t.abs();
                }
                (sum, (nb + 2) as f64 * f32::EPSILON as f64 * abs)
            })
            .collect()
    }

    /// Per output: `Σ_j |w_j| · 0.6 · amax_256(j) / 127`, a bound on what quantizing the
    /// activation to 8 bits moves a product by, for any per-block scheme with blocks of up to
    /// 256 values (Q8_0's 32 as we and candle's AVX2 path use, Q8_K's 256 as candle's AVX-512
    /// VNNI path uses): each value moves by at most half a step plus the f16 rounding of the
    /// scale (127 · 2⁻¹¹ of a step), and a step is at most `amax / 127` of its block.
    fn activation_quantization_bound(deq: &[f32], k: usize, x: &[f32]) -> Vec<f64> {
        let step: Vec<f64> = x
            .chunks(256)
            .flat_map(|c| {
                let amax = c.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                std::iter::repeat_n(0.6 * amax / 127.0, c.len())
            })
            .collect();
        deq.chunks_exact(k).map(|w| w.iter().zip(&step).map(|(w, s)| w.abs() as f64 * s).sum::<f64>() + 1e-6).collect()
    }

    /// The product on every path (each must equal the portable one bit for bit), with each
    /// batched row equal to the same row alone.
    fn every_path(packed: &Packed32, x: &[f32], rows: usize) -> Vec<f32> {
        let (n, k) = (packed.rows(), packed.cols());
        let mut want = vec![0f32; rows * n];
        packed.matmul_at(Path::Portable, x, rows, &mut want);
        for p in paths() {
            let mut y = vec![0f32; rows * n];
            packed.matmul_at(p, x, rows, &mut y);
            assert!(
                y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{p:?} {:?} [{n}x{k}] × {rows} rows differs from portable",
                packed.format()
            );
            for r in [0, rows / 2, rows - 1] {
                let mut alone = vec![0f32; n];
                packed.matmul_at(p, &x[r * k..(r + 1) * k], 1, &mut alone);
                assert_eq!(alone[..], y[r * n..(r + 1) * n], "{p:?} [{n}x{k}] row {r} of {rows}");
            }
        }
        want
    }

    fn check(n: usize, k: usize, rows: usize) {
        for format in [Format::Q8_0, Format::Q5_0, Format::Q4_0] {
            check_format(format, n, k, rows);
        }
    }

    fn check_format(format: Format, n: usize, k: usize, rows: usize) {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 0.05, (n, k), &dev).unwrap();
        let q = QTensor::quantize(&w, format.dtype()).unwrap();
        let packed = Packed32::from_qtensor(&q).unwrap();
        let deq: Vec<f32> = q.dequantize(&dev).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let x = Tensor::randn(0f32, 1.0, (rows, k), &dev).unwrap();
        // candle's kernels need SDOT on aarch64 (see `repack`); where there is none, only ours run.
        let candle: Option<Vec<f32>> = crate::model::repack::candle_dots_run_here()
            .then(|| QMatMul::from_qtensor(q).unwrap().forward(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap());
        let xv: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        let y = every_path(&packed, &xv, rows);
        let mut xq = vec![0i8; k];
        let mut xd = vec![0f32; k / QK];
        for r in 0..rows {
            let xr = &xv[r * k..(r + 1) * k];
            // Every output within the f32 rounding bound of the exact product.
            quantize_row(xr, &mut xq, &mut xd);
            for (i, (want, tol)) in exact_with_bound(&deq, k, &xq, &xd).into_iter().enumerate() {
                let got = y[r * n + i] as f64;
                assert!((got - want).abs() <= tol, "{format:?} [{n}x{k}] row {r} out {i}: {got} vs exact {want} (bound {tol:e})");
            }
            // candle's QMatMul computes the same product by a CPU-dependent path (see the
            // module note): both it and we must be within the activation-quantization bound
            // of the product with the unquantized activation.
            let bounds = activation_quantization_bound(&deq, k, xr);
            for (i, (wr, tol)) in deq.chunks_exact(k).zip(bounds).enumerate() {
                let truth: f64 = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
                let ours = y[r * n + i] as f64;
                assert!((ours - truth).abs() <= tol, "[{n}x{k}] out {i}: ours {ours} vs {truth} (bound {tol})");
                if let Some(candle) = &candle {
                    let theirs = candle[r * n + i] as f64;
                    assert!((theirs - truth).abs() <= tol, "[{n}x{k}] out {i}: candle {theirs} vs {truth} (bound {tol})");
                }
            }
        }
        assert_eq!(packed.dequantize(), deq);
        let mut row = vec![0f32; k];
        for r in [0, n / 2, n - 1] {
            packed.dequantize_row(r, &mut row);
            assert_eq!(row[..], deq[r * k..(r + 1) * k]);
        }
    }

    #[test]
    fn every_path_matches_the_exact_product() {
        for &(n, k) in
            &[(1, 576), (3, 576), (17, 1024), (49, 1536), (130, 3072), (1536, 576), (2051, 1024), (256, 3072), (512, 3072)]
        {
            check(n, k, 1);
        }
        check(67, 1024, 3);
        check(130, 3072, 40);
        check(256, 3072, 5);
        // Prefill sizes: more rows than a row group, not a multiple of 4.
        check(96, 576, 131);
        // Around the AMX path's groups of 16 rows (an odd number of blocks: a lone last block).
        for rows in [15, 16, 17, 32, 48] {
            check(33, 96, rows);
        }
    }

    /// Weights of -128 (a Q8_0 file may hold them; our quantizer never writes them) and
    /// activations of ±127 take the AVX2 path's largest pair sums: no saturation, same bits.
    #[test]
    fn extreme_quants_are_exact() {
        let (n, k) = (19, 64);
        let nb = k / QK;
        let mut bytes = Vec::new();
        for r in 0..n {
            for b in 0..nb {
                bytes.extend(f16::from_f32(0.5 + r as f32 / 8.0 + b as f32).to_le_bytes());
                bytes.extend((0..QK).map(|i| if (i + r) % 3 == 0 { 0x80 } else { 0x7f }));
            }
        }
        let packed = Packed32::from_q8_0_bytes(&bytes, n, k).unwrap();
        // Activations quantizing to ±127 with scale 1 (17 rows: one AMX group and a tail).
        let x: Vec<f32> = (0..17 * k).map(|i| if i % 2 == 0 { 127.0 } else { -127.0 }).collect();
        let y = every_path(&packed, &x, 17);
        let deq = packed.dequantize();
        let (mut xq, mut xd) = (vec![0i8; k], vec![0f32; nb]);
        quantize_row(&x[..k], &mut xq, &mut xd);
        assert!(xq.iter().all(|v| v.abs() == 127) && xd.iter().all(|&d| d == 1.0));
        for (i, (want, tol)) in exact_with_bound(&deq, k, &xq, &xd).into_iter().enumerate() {
            assert!((y[i] as f64 - want).abs() <= tol, "out {i}: {} vs {want}", y[i]);
        }
    }

    /// The bound in `check` is tight enough to catch a wrong result: dropping one block of one
    /// row or using a neighbouring row's scale breaks it.
    #[test]
    fn the_exact_bound_rejects_a_wrong_block() {
        let (n, k) = (8, 1024);
        // Deterministic data (candle's CPU randn cannot be seeded): a random draw could make
        // the dropped block's share small enough to hide in the bound.
        let wv: Vec<f32> = (0..n * k).map(|i| 0.05 * ((i as f32) * 0.731).sin()).collect();
        let w = Tensor::from_vec(wv, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let deq: Vec<f32> = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let x: Vec<f32> = (0..k).map(|j| ((j as f32) * 1.37).cos()).collect();
        let (mut xq, mut xd) = (vec![0i8; k], vec![0f32; k / QK]);
        quantize_row(&x, &mut xq, &mut xd);
        let exact = exact_with_bound(&deq, k, &xq, &xd);
        let mut broken = deq.clone();
        broken[..QK].iter_mut().for_each(|v| *v = 0.0);
        let (wrong, _) = exact_with_bound(&broken, k, &xq, &xd)[0];
        let (want, tol) = exact[0];
        assert!((wrong - want).abs() > 100.0 * tol, "{wrong} vs {want} ± {tol}");
    }

    /// aarch64 always has the NEON path, and the SDOT one where the CPU has SDOT.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_paths_on_aarch64() {
        let p = paths();
        assert!(p.contains(&Path::Neon));
        assert_eq!(p.contains(&Path::NeonDot), crate::simd::neon::has_dotprod());
        assert_eq!(path(), if crate::simd::forced_portable() { Path::Portable } else { *p.last().unwrap() });
    }

    /// Every path quantizes like the portable code (candle's quantizer), including halves,
    /// NaN, infinities, subnormal and huge blocks.
    #[test]
    fn every_path_quantizes_the_same() {
        let mut x: Vec<f32> = (0..32 * 64).map(|i| ((i * 7919 % 2001) as f32 - 1000.0) / 37.0).collect();
        // Values landing exactly on halves after scaling by 127 / amax (amax 127 → id 1).
        x[..32].iter_mut().enumerate().for_each(|(i, v)| *v = i as f32 - 15.5);
        x[31] = 127.0;
        x[32..64].iter_mut().enumerate().for_each(|(i, v)| *v = -(i as f32) - 0.5);
        x[63] = -127.0;
        x[64] = f32::NAN;
        x[96] = f32::INFINITY;
        x[128] = f32::NEG_INFINITY;
        x[160..192].iter_mut().for_each(|v| *v = 1e-42);
        x[192..224].iter_mut().enumerate().for_each(|(i, v)| *v = if i == 0 { 0.0 } else { -0.0 });
        x[224..256].iter_mut().enumerate().for_each(|(i, v)| *v = (i as f32 - 16.0) * 1e37);
        let (mut q0, mut d0) = (vec![0i8; x.len()], vec![0f32; x.len() / QK]);
        quantize_row_portable(&x, &mut q0, &mut d0);
        assert_eq!(
            &q0[..32],
            &(0..32).map(|i| if i == 31 { 127 } else { ((i as f32 - 15.5).round()) as i8 }).collect::<Vec<_>>()[..]
        );
        for p in paths() {
            let (mut q, mut d) = (vec![0i8; x.len()], vec![0f32; x.len() / QK]);
            quantize_row_at(p, &x, &mut q, &mut d);
            assert_eq!(q, q0, "{p:?}");
            assert!(d.iter().zip(&d0).all(|(a, b)| a.to_bits() == b.to_bits()), "{p:?}");
        }
    }

    /// ggml's Q5_0 block bytes for `u` (32 values in 0..32) and scale bits `d`.
    fn q5_0_block(u: &[u8; QK], d: u16) -> Vec<u8> {
        let mut b = d.to_le_bytes().to_vec();
        let qh: u32 = (0..QK).map(|j| (((u[j] >> 4) & 1) as u32) << j).sum();
        b.extend(qh.to_le_bytes());
        b.extend((0..16).map(|j| (u[j] & 0x0F) | (u[j + 16] & 0x0F) << 4));
        b
    }

    /// Q5_0 and Q4_0 run natively with the very integers and scales of the same blocks as
    /// Q8_0 (`q − 16` / `q − 8` with the same `d`), so they give the bits the earlier lossless
    /// repack to Q8_0 gave, on every path; extreme quants (0 and 31 against ±127) included.
    #[test]
    fn nibble_formats_equal_the_same_blocks_as_q8_0() {
        let (n, k) = (21, 256);
        let mut seed = 1u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            seed >> 8
        };
        for format in [Format::Q5_0, Format::Q4_0] {
            let top = if format == Format::Q5_0 { 32 } else { 16 };
            let (mut native, mut as_q8) = (Vec::new(), Vec::new());
            for r in 0..n {
                for _ in 0..k / QK {
                    let u: [u8; QK] = std::array::from_fn(|i| match r {
                        0 => top as u8 - 1,
                        1 => 0,
                        _ => (next() % top) as u8,
                    } ^ if r < 2 && i % 3 == 0 { top as u8 - 1 } else { 0 });
                    let d = f16::from_f32(0.01 + (next() % 100) as f32 / 1000.0).to_bits();
                    match format {
                        Format::Q5_0 => native.extend(q5_0_block(&u, d)),
                        _ => {
                            native.extend(d.to_le_bytes());
                            native.extend((0..16).map(|j| (u[j] & 0x0F) | (u[j + 16] & 0x0F) << 4));
                        }
                    }
                    as_q8.extend(d.to_le_bytes());
                    as_q8.extend(u.iter().map(|&v| (v as i32 - format.bias()) as i8 as u8));
                }
            }
            let p = Packed32::from_ggml_bytes(format, &native, n, k).unwrap();
            let p8 = Packed32::from_q8_0_bytes(&as_q8, n, k).unwrap();
            assert_eq!(p.dequantize(), p8.dequantize(), "{format:?}");
            // Against candle's reading of the same bytes.
            let storage = candle_core::quantized::QStorage::from_data(
                std::borrow::Cow::Borrowed(&native[..]),
                &Device::Cpu,
                format.dtype(),
            )
            .unwrap();
            let q = QTensor::new(storage, (n, k)).unwrap();
            let candle: Vec<f32> = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            assert_eq!(p.dequantize(), candle, "{format:?}");
            let x: Vec<f32> = (0..5 * k).map(|i| if i % 7 < 3 { 127.0 } else { -127.0 }).collect();
            let y = every_path(&p, &x, 5);
            assert_eq!(y, every_path(&p8, &x, 5), "{format:?}");
            assert!(p.size_in_bytes() * 8 < p8.size_in_bytes() * (if format == Format::Q5_0 { 6 } else { 5 }));
        }
    }

    #[test]
    fn zero_rows_and_activation() {
        let (n, k) = (6, 64);
        let packed = Packed32::from_q8_0_bytes(&vec![0u8; n * (k / QK) * Q8_0_BYTES], n, k).unwrap();
        let mut y = vec![1f32; n];
        packed.matmul(&vec![0f32; k], 1, &mut y);
        assert!(y.iter().all(|v| *v == 0.0));
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(Packed32::from_ggml_bytes(Format::Q5_0, &[0u8; 23], 1, 32).is_err());
        assert!(Packed32::from_ggml_bytes(Format::Q4_0, &[0u8; 18], 1, 64).is_err());
        let huge = Packed32::from_ggml_bytes(Format::Q4_0, &[], usize::MAX / 2, 1 << 20).err().map(|e| e.code());
        assert_eq!(huge, Some("OUT_OF_MEMORY"));
        assert!(Packed32::from_q8_0_bytes(&[0u8; 33], 1, 32).is_err());
        assert!(Packed32::from_q8_0_bytes(&[], 0, 32).is_err());
        assert!(Packed32::from_q8_0_bytes(&[0u8; 34], 1, 31).is_err());
        assert_eq!(Packed32::from_rows(usize::MAX / 2, 1 << 20, |_, _| Ok(())).err().map(|e| e.code()), Some("OUT_OF_MEMORY"));
    }
}
