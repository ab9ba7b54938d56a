//! The x86 paths of [`super`]: CPU detection, the AVX2 activation quantizer, and the tile
//! kernels for AMX (`tdpbsud`, Q8_0), AVX-512 VNNI (`vpdpbusd`) and AVX2 (`maddubs`), each
//! giving the portable path's bits.

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
                    s[ch] = _mm512_dpbusd_epi32(s[ch], hi, _mm512_set1_epi32(std::ptr::read_unaligned(x.add(4) as *const i32)));
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
