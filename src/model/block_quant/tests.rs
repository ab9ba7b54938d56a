//! Tests of [`super`]: the bytes of [`super::q4_0`] and [`super::q6_k`] against candle's
//! quantizers on every path this CPU runs (random and hard values), and the rounding helpers
//! against the library's `round`.

use super::*;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// Our bytes and candle's for the same values, per path this CPU runs.
fn check(values: &[f32], what: &str) {
    let dev = Device::Cpu;
    let t = Tensor::from_vec(values.to_vec(), values.len(), &dev).unwrap();
    if values.len().is_multiple_of(QK_K) {
        let want = QTensor::quantize(&t, GgmlDType::Q6K).unwrap().data().unwrap().to_vec();
        let mut got = vec![BlockQ6K::zeros(); values.len() / QK_K];
        q6_k(values, &mut got);
        assert_eq!(blocks_bytes(&got), &want[..], "q6_k: {what}");
        // Every path this CPU has.
        type Path = (&'static str, fn(&[f32], &mut [u8]));
        #[allow(unused_mut)] // nothing is added off x86-64
        let mut paths: Vec<Path> = vec![("portable", q6_k_bytes)];
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            paths.push(("avx2", |x, o| unsafe { q6_k_avx2(x, o) }));
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx2") {
            paths.push(("avx512", |x, o| unsafe { q6_k_avx512(x, o) }));
        }
        for (path, f) in paths {
            let mut bytes = vec![0u8; want.len()];
            f(values, &mut bytes);
            assert_eq!(bytes, want, "q6_k {path}: {what}");
        }
    }
    let want = QTensor::quantize(&t, GgmlDType::Q4_0).unwrap().data().unwrap().to_vec();
    let mut got = vec![BlockQ4_0::zeros(); values.len() / Q4_0_VALUES];
    q4_0(values, &mut got);
    let mut portable = vec![0u8; want.len()];
    q4_0_bytes(values, &mut portable);
    assert_eq!(blocks_bytes(&got), &want[..], "q4_0: {what}");
    assert_eq!(portable, want, "q4_0 portable: {what}");
}

fn blocks_bytes<T>(b: &[T]) -> &[u8] {
    // SAFETY: test-only view of the plain-old-data blocks as their bytes.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u8, std::mem::size_of_val(b)) }
}

use candle_core::quantized::k_quants::GgmlType;

#[test]
fn equals_candles_quantizers_on_random_values() {
    // A fixed generator: roughly normal values (a sum of uniforms), reproducible.
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    for std in [1.0f32, 0.02, 300.0] {
        let v: Vec<f32> = (0..256 * QK_K).map(|_| ((0..4).map(|_| uniform()).sum::<f32>() - 2.0) * std).collect();
        check(&v, &format!("random × {std}"));
    }
}

#[test]
fn equals_candles_quantizers_on_hard_values() {
    let mut v = vec![0f32; 11 * QK_K]; // blocks fitted four at a time, and three left
                                       // Block 0 all zeros; block 1: -0.0 and one tiny value per sub-block; block 2: values
                                       // whose squares underflow; block 3: ties of the largest magnitude with both signs;
                                       // block 4: halves (rounding ties); block 5: one huge value; 6–10: integer ramps.
    for (i, x) in v[QK_K..2 * QK_K].iter_mut().enumerate() {
        *x = if i % 16 == 3 { 1e-30 } else { -0.0 };
    }
    for (i, x) in v[2 * QK_K..3 * QK_K].iter_mut().enumerate() {
        *x = (i as f32 - 128.0) * 1e-25;
    }
    for (i, x) in v[3 * QK_K..4 * QK_K].iter_mut().enumerate() {
        *x = [1.0, -1.0, 0.5, -0.25][i % 4];
    }
    for (i, x) in v[4 * QK_K..5 * QK_K].iter_mut().enumerate() {
        *x = (i % 33) as f32 * 0.5 - 8.0;
    }
    for (i, x) in v[5 * QK_K..6 * QK_K].iter_mut().enumerate() {
        *x = if i == 77 { 3.0e38 } else { (i as f32).sin() };
    }
    for (i, x) in v[6 * QK_K..].iter_mut().enumerate() {
        *x = (i % 64) as f32 - 31.0;
    }
    check(&v, "hard values");
}

#[test]
fn rounding_matches_the_library_round() {
    for v in [
        0.5f32,
        -0.5,
        1.5,
        -1.5,
        2.5,
        0.49999997,
        -0.49999997,
        31.5,
        -32.5,
        1e10,
        -1e10,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        8388607.5,
        3e9,
        -3e9,
    ] {
        assert_eq!(round_i32(v), v.round() as i32, "{v}");
        assert_eq!(round_clamped(v, -32.0, 31.0), (v.round() as i32).clamp(-32, 31) as f32, "{v}");
    }
}
