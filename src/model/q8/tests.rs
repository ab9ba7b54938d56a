//! Tests of [`super`]: every path against the exact product and candle's quantized matmul, bit
//! for bit against the portable path, the nibble formats against the same blocks as Q8_0, and
//! the shape and size errors.

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
        // module note of `q8`): both it and we must be within the activation-quantization bound
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
    for &(n, k) in &[(1, 576), (3, 576), (17, 1024), (49, 1536), (130, 3072), (1536, 576), (2051, 1024), (256, 3072), (512, 3072)]
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
        let storage =
            candle_core::quantized::QStorage::from_data(std::borrow::Cow::Borrowed(&native[..]), &Device::Cpu, format.dtype())
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
