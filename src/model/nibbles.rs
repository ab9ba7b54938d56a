//! The 4-bit layout both packed kernels store: [`super::q8`] for Q5_0 / Q4_0 blocks,
//! [`super::kquant`] for Q4_K / Q5_K sub-blocks and the low nibbles of Q6_K.
//!
//! A group of 32 values of 16 rows is 4 lines of 64 bytes: line `p` holds, for each row in turn,
//! 4 bytes whose low nibbles are values `8p..8p+4` and whose high nibbles are `8p+4..8p+8`. A
//! nibble mask and a shift make two VNNI operands of a line, whose 16 32-bit lanes are the 16
//! rows. A fifth bit, where the format has one, lives in one more line: bit `2p + h` of a row's
//! byte `i` for the value in half `h` (0 low nibble, 1 high) of byte `i` of line `p`.

/// Bytes of one line: 4 for each of the 16 rows.
pub(super) const LINE: usize = 64;
/// Bytes of a group's 4 nibble lines.
pub(super) const GROUP: usize = 4 * LINE;

/// Where value `v` (0..32) of row `lane` sits: `(line p, half h, byte within the line)`.
#[inline(always)]
fn place(lane: usize, v: usize) -> (usize, usize, usize) {
    (v / 8, (v / 4) % 2, lane * 4 + v % 4)
}

/// Writes the low 4 bits of `u` as value `v` of row `lane` into a zeroed group (`lines`:
/// `GROUP` bytes) and, with `fifth` (`LINE` bytes), its bit 4: the definition [`put_block`]
/// is tested against.
#[cfg(test)]
pub(super) fn put(lines: &mut [u8], fifth: Option<&mut [u8]>, lane: usize, v: usize, u: u8) {
    let (p, h, i) = place(lane, v);
    lines[p * LINE + i] |= (u & 0x0F) << (4 * h);
    if let Some(f) = fifth {
        f[i] |= ((u >> 4) & 1) << (2 * p + h);
    }
}

/// Writes the 32 values `u` (their low 4 bits, and bit 4 with `fifth`) as row `lane` of a
/// group, a byte at a time: what [`put`] of each value does to a zeroed group, in the
/// time a load can afford (one call per block instead of 32).
#[inline]
pub(super) fn put_block(lines: &mut [u8], fifth: Option<&mut [u8]>, lane: usize, u: &[u8]) {
    let u: &[u8; 32] = u.try_into().expect("a block of 32 values");
    let mut bits = [0u8; 4];
    for p in 0..4 {
        let line = &mut lines[p * LINE + lane * 4..][..4];
        for i in 0..4 {
            let (lo, hi) = (u[8 * p + i], u[8 * p + 4 + i]);
            line[i] = (lo & 0x0F) | ((hi & 0x0F) << 4);
            bits[i] |= (((lo >> 4) & 1) << (2 * p)) | (((hi >> 4) & 1) << (2 * p + 1));
        }
    }
    if let Some(f) = fifth {
        f[lane * 4..][..4].copy_from_slice(&bits);
    }
}

/// Value `v` of row `lane` as [`put`] wrote it (bit 4 only with `fifth`).
pub(super) fn get(lines: &[u8], fifth: Option<&[u8]>, lane: usize, v: usize) -> u8 {
    let (p, h, i) = place(lane, v);
    let nibble = (lines[p * LINE + i] >> (4 * h)) & 0x0F;
    nibble | fifth.map_or(0, |f| ((f[i] >> (2 * p + h)) & 1) << 4)
}

/// The two values of a row's `byte` of line `p` (values `8p + i` and `8p + 4 + i`), their
/// fifth bits taken from `fifth_byte` (0 where there are none).
#[inline(always)]
pub(super) fn pair(byte: u8, fifth_byte: u8, p: usize) -> (u8, u8) {
    let bit = |h: usize| ((fifth_byte >> (2 * p + h)) & 1) << 4;
    ((byte & 0x0F) | bit(0), (byte >> 4) | bit(1))
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    /// The two VNNI operands of line `p` (`w`), with their fifth bits from the group's fifth
    /// line `qh` when `FIFTH`: bits `2p` and `2p + 1` shifted to bit 4. A 16-bit shift of at
    /// most 4 left or 3 right never carries another byte's bit into bit 4. Called with a
    /// literal `p`, the match folds away.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(crate) fn vnni_operands<const FIFTH: bool>(w: __m512i, qh: __m512i, p: usize) -> (__m512i, __m512i) {
        let nib = _mm512_set1_epi8(0x0F);
        let (lo, hi) = (_mm512_and_si512(w, nib), _mm512_and_si512(_mm512_srli_epi16::<4>(w), nib));
        if !FIFTH {
            return (lo, hi);
        }
        let (bl, bh) = match p {
            0 => (_mm512_slli_epi16::<4>(qh), _mm512_slli_epi16::<3>(qh)),
            1 => (_mm512_slli_epi16::<2>(qh), _mm512_slli_epi16::<1>(qh)),
            2 => (qh, _mm512_srli_epi16::<1>(qh)),
            _ => (_mm512_srli_epi16::<2>(qh), _mm512_srli_epi16::<3>(qh)),
        };
        // (bit & 0x10) | nibble in one instruction.
        let bit4 = _mm512_set1_epi8(0x10);
        (_mm512_ternarylogic_epi32::<0xEA>(bl, bit4, lo), _mm512_ternarylogic_epi32::<0xEA>(bh, bit4, hi))
    }

    /// [`vnni_operands`] for 8 rows (one 32-byte half of a line and of `qh`), `fifth` at run
    /// time: the fifth bits move by a 32-bit shift (right by `2p + h`, left by 4), then one bit
    /// per byte is kept.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn avx2_operands(w: __m256i, qh: __m256i, p: usize, fifth: bool) -> (__m256i, __m256i) {
        let nib = _mm256_set1_epi8(0x0F);
        let (lo, hi) = (_mm256_and_si256(w, nib), _mm256_and_si256(_mm256_srli_epi16::<4>(w), nib));
        if !fifth {
            return (lo, hi);
        }
        // No closure here: a closure would not inherit this function's target features.
        let bit4 = _mm256_set1_epi8(0x10);
        let bl = _mm256_slli_epi32::<4>(_mm256_srl_epi32(qh, _mm_cvtsi32_si128(2 * p as i32)));
        let bh = _mm256_slli_epi32::<4>(_mm256_srl_epi32(qh, _mm_cvtsi32_si128(2 * p as i32 + 1)));
        (_mm256_or_si256(lo, _mm256_and_si256(bl, bit4)), _mm256_or_si256(hi, _mm256_and_si256(bh, bit4)))
    }
}

#[cfg(target_arch = "aarch64")]
pub(super) mod neon {
    use std::arch::aarch64::*;

    /// The two operands of 16 bytes `w` of line `p` (4 rows' bytes), as signed bytes (the
    /// values are below 32), with their fifth bits from the same 16 bytes `qh` of the group's
    /// fifth line when `FIFTH`: bits `2p` and `2p + 1` moved to bit 4 by a per-byte shift
    /// (`vshlq_u8` shifts right for a negative count), so no other byte's bit reaches it.
    #[inline(always)]
    pub(crate) fn operands<const FIFTH: bool>(w: uint8x16_t, qh: uint8x16_t, p: usize) -> (int8x16_t, int8x16_t) {
        // SAFETY: NEON is part of every aarch64 target.
        unsafe {
            let (lo, hi) = (vandq_u8(w, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(w));
            if !FIFTH {
                return (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi));
            }
            let bit4 = vdupq_n_u8(0x10);
            let bl = vandq_u8(vshlq_u8(qh, vdupq_n_s8(4 - 2 * p as i8)), bit4);
            let bh = vandq_u8(vshlq_u8(qh, vdupq_n_s8(3 - 2 * p as i8)), bit4);
            (vreinterpretq_s8_u8(vorrq_u8(lo, bl)), vreinterpretq_s8_u8(vorrq_u8(hi, bh)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block written at once equals its 32 values written one by one, with and without
    /// fifth bits, in every lane.
    #[test]
    fn put_block_equals_put_of_each_value() {
        let mut seed = 7u32;
        for lane in 0..16 {
            let u: Vec<u8> = (0..32)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 24) as u8 & 0x1F
                })
                .collect();
            for with_fifth in [false, true] {
                let (mut a, mut b) = (vec![0u8; GROUP], vec![0u8; GROUP]);
                let (mut fa, mut fb) = (vec![0u8; LINE], vec![0u8; LINE]);
                for (v, &x) in u.iter().enumerate() {
                    put(&mut a, with_fifth.then_some(&mut fa[..]), lane, v, x);
                }
                put_block(&mut b, with_fifth.then_some(&mut fb[..]), lane, &u);
                assert_eq!((a, fa), (b, fb), "lane {lane}, fifth {with_fifth}");
            }
        }
    }
}
