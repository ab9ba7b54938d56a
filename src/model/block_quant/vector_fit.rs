//! The Q6_K fit in vector lanes (x86): [`fit_simd`], written once over the operations of
//! [`simd::Simd`] and run with AVX2 or AVX-512, and the rounding of a lane to its code
//! ([`code`], [`code_not_nan`]).

use super::{simd, SUB};

/// [`fit_sub_blocks`](super::fit_sub_blocks) for 32 lanes (two blocks), `G` vectors of `S::WIDTH` lanes per
/// variable: the same operations per lane in the same order, selects as blends, the scalar
/// code's early exits as masks. In the last loop an improvement only moves `sumlx` / `suml2`;
/// the scale is divided once after each pass (the scalar code divides at each improvement:
/// the last one counts).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn fit_simd<S: simd::Simd, const G: usize, const N: usize>(xs: &[f32]) -> ([f32; N], [[f32; N]; SUB]) {
    assert!(G * S::WIDTH == N && xs.len() == N * SUB);
    let (zero, one) = (S::splat(0.0), S::splat(1.0));
    let (add, sub, mul, div) = (|a, b| S::add(a, b), |a, b| S::sub(a, b), |a, b| S::mul(a, b), |a, b| S::div(a, b));
    let q = |v| code::<S>(v);
    let any = |m: &[S::M; G]| m.iter().any(|&m| !S::none(m));
    // x[i][g]: value i of the sub-blocks of vector g, gathered (a stride of 16 values).
    let x: [[S::V; G]; SUB] =
        std::array::from_fn(|i| std::array::from_fn(|g| S::gather16(xs.as_ptr().add(S::WIDTH * g * SUB + i))));
    // The weights `w = x²` and `w · x`, as the scalar code computes them each time.
    let w: [[S::V; G]; SUB] = std::array::from_fn(|i| std::array::from_fn(|g| mul(x[i][g], x[i][g])));
    let wx: [[S::V; G]; SUB] = std::array::from_fn(|i| std::array::from_fn(|g| mul(w[i][g], x[i][g])));
    let mut amax = [zero; G];
    let mut max = [zero; G];
    for xi in &x {
        for g in 0..G {
            let ax = S::abs(xi[g]);
            let take = S::gt(ax, amax[g]);
            amax[g] = S::select(take, amax[g], ax);
            max[g] = S::select(take, max[g], xi[g]);
        }
    }
    // The first estimate.
    let mut ls = [[zero; G]; SUB];
    let mut sumlx = [zero; G];
    let mut suml2 = [zero; G];
    let mut scale = [zero; G];
    let mut best = [zero; G];
    for g in 0..G {
        let iscale = div(S::splat(-32.0), max[g]);
        for i in 0..SUB {
            let l = q(mul(iscale, x[i][g]));
            ls[i][g] = l;
            sumlx[g] = add(sumlx[g], mul(wx[i][g], l));
            suml2[g] = add(suml2[g], mul(mul(w[i][g], l), l));
        }
        scale[g] = div(sumlx[g], suml2[g]);
        best[g] = mul(scale[g], sumlx[g]);
    }
    // Up to three refits.
    for _ in 0..3 {
        let mut keep = [S::no_mask(); G];
        let mut nl = [[zero; G]; SUB];
        let (mut slx, mut sl2) = ([zero; G], [zero; G]);
        for g in 0..G {
            let iscale = div(one, scale[g]);
            let mut changed = S::no_mask();
            for i in 0..SUB {
                let l = q(mul(iscale, x[i][g]));
                nl[i][g] = l;
                changed = S::or_m(changed, S::ne(l, ls[i][g]));
                slx[g] = add(slx[g], mul(wx[i][g], l));
                sl2[g] = add(sl2[g], mul(mul(w[i][g], l), l));
            }
            let fits = S::nle_u(mul(slx[g], slx[g]), mul(best[g], sl2[g]));
            keep[g] = S::and_m(S::and_m(changed, S::ne_u(sl2[g], zero)), fits);
        }
        if !any(&keep) {
            break;
        }
        for g in 0..G {
            for i in 0..SUB {
                ls[i][g] = S::select(keep[g], ls[i][g], nl[i][g]);
            }
            sumlx[g] = S::select(keep[g], sumlx[g], slx[g]);
            suml2[g] = S::select(keep[g], suml2[g], sl2[g]);
            scale[g] = S::select(keep[g], scale[g], div(sumlx[g], suml2[g]));
            best[g] = S::select(keep[g], best[g], mul(scale[g], sumlx[g]));
        }
    }
    // Up to five passes of one-value-at-a-time improvement. A vector none of whose lanes
    // moved in a pass is left out of the next (a pass that moves nothing changes nothing).
    let mut active = [true; G];
    for _ in 0..5 {
        let mut moved = [S::no_mask(); G];
        for i in 0..SUB {
            for g in 0..G {
                if !active[g] {
                    continue;
                }
                let (x, w, wx, l) = (x[i][g], w[i][g], wx[i][g], ls[i][g]);
                let slx = sub(sumlx[g], mul(wx, l));
                let sl2 = sub(suml2[g], mul(mul(w, l), l));
                let new_l = code_not_nan::<S>(div(mul(x, sl2), slx));
                let slx_new = add(slx, mul(wx, new_l));
                let sl2_new = add(sl2, mul(mul(w, new_l), new_l));
                let better = S::gt(mul(mul(slx_new, slx_new), suml2[g]), mul(mul(sumlx[g], sumlx[g]), sl2_new));
                let take = S::and_m(S::and_m(S::gt(slx, zero), S::ne(new_l, l)), S::and_m(S::gt(sl2_new, zero), better));
                ls[i][g] = S::select(take, l, new_l);
                sumlx[g] = S::select(take, sumlx[g], slx_new);
                suml2[g] = S::select(take, suml2[g], sl2_new);
                moved[g] = S::or_m(moved[g], take);
            }
        }
        for g in 0..G {
            scale[g] = S::select(moved[g], scale[g], div(sumlx[g], suml2[g]));
            active[g] = !S::none(moved[g]);
        }
        if !any(&moved) {
            break;
        }
    }
    // An all-zero sub-block: scale 0, codes 0; the others' codes offset to 0..64.
    let nmax = S::splat(32.0);
    let mut out_scale = [0f32; N];
    let mut out_ls = [[0f32; N]; SUB];
    for g in 0..G {
        let nonzero = S::ne_u(amax[g], zero);
        S::store(out_scale.as_mut_ptr().add(S::WIDTH * g), S::keep(scale[g], nonzero));
        for i in 0..SUB {
            S::store(out_ls[i].as_mut_ptr().add(S::WIDTH * g), S::keep(add(ls[i][g], nmax), nonzero));
        }
    }
    (out_scale, out_ls)
}

/// `round_clamped(v, -32, 31)` per lane: NaN → 0, clamp, then half away from zero as
/// `floor(|v| + 0.5)` for `|v| ≥ 0.5` (exact there: the sum cannot round across an integer
/// below 32) and 0 below, with `v`'s sign put back. A zero code may come out as -0.0 where the
/// scalar code has +0.0; nothing downstream depends on the sign of a zero (a zero code adds
/// a zero to the sums, the comparisons treat ±0 alike, and a code is used as an integer).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn code<S: simd::Simd>(v: S::V) -> S::V {
    code_not_nan::<S>(S::keep(v, S::ord(v)))
}

/// [`code`] of a `v` with no NaN lane that matters (a NaN lane's result is unspecified).
/// The one-at-a-time loop uses it: a NaN there comes from an infinite or NaN sum, with which
/// its "better fit" test is false, so the code is never kept.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn code_not_nan<S: simd::Simd>(v: S::V) -> S::V {
    let v = S::min(S::max(v, S::splat(-32.0)), S::splat(31.0));
    let (a, half) = (S::abs(v), S::splat(0.5));
    let r = S::keep(S::floor(S::add(a, half)), S::ge(a, half));
    S::or(r, S::sign(v))
}
