use super::*;
use candle_core::quantized::{QMatMul, QStorage};
use candle_core::{DType, Device, Module, Tensor};
use std::borrow::Cow;

const KINDS: [Kind; 3] = [Kind::Q4K, Kind::Q5K, Kind::Q6K];

/// Deterministic pseudo-random numbers (candle's CPU `randn` cannot be seeded).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    /// Roughly normal, mean 0, deviation `sd`.
    fn normal(&mut self, sd: f32) -> f32 {
        let s: f32 = (0..4).map(|_| self.next() as f32 / (1u64 << 31) as f32 - 0.5).sum();
        s * sd * 1.7
    }

    fn vec(&mut self, len: usize, sd: f32) -> Vec<f32> {
        (0..len).map(|_| self.normal(sd)).collect()
    }
}

fn qtensor(kind: Kind, bytes: &[u8], n: usize, k: usize) -> QTensor {
    let storage = QStorage::from_data(Cow::Borrowed(bytes), &Device::Cpu, kind.dtype()).unwrap();
    QTensor::new(storage, (n, k)).unwrap()
}

/// ggml blocks of random bytes: every bit pattern of quants, scales and mins is a valid
/// block; `d` and `dmin` are kept finite and of moderate size.
fn random_blocks(kind: Kind, n: usize, k: usize, rng: &mut Lcg) -> Vec<u8> {
    let gb = kind.ggml_bytes();
    let mut bytes: Vec<u8> = (0..n * k / QK_K * gb).map(|_| rng.next() as u8).collect();
    for b in bytes.chunks_exact_mut(gb) {
        let mut half = || f16::from_f32(rng.normal(0.01)).to_le_bytes();
        match kind {
            Kind::Q4K | Kind::Q5K => {
                b[..2].copy_from_slice(&half());
                b[2..4].copy_from_slice(&half());
            }
            Kind::Q6K => b[208..].copy_from_slice(&half()),
        }
    }
    bytes
}

fn dequantized(q: &QTensor) -> Vec<f32> {
    q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn the_repack_is_lossless() {
    let mut rng = Lcg(7);
    for kind in KINDS {
        let (n, k) = (37, 512);
        // Blocks from candle's quantizer and blocks of random bytes.
        let w = Tensor::from_vec(rng.vec(n * k, 0.05), (n, k), &Device::Cpu).unwrap();
        let from_candle = QTensor::quantize(&w, kind.dtype()).unwrap();
        let random = qtensor(kind, &random_blocks(kind, n, k, &mut rng), n, k);
        for q in [from_candle, random] {
            let packed = PackedK::from_qtensor(&q).unwrap();
            let want = dequantized(&q);
            let got = packed.dequantize();
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{kind:?}");
            let mut row = vec![0f32; k];
            for r in [0, 16, n - 1] {
                packed.dequantize_row(r, &mut row);
                assert_eq!(row[..], want[r * k..(r + 1) * k], "{kind:?} row {r}");
            }
            let ids = Tensor::new(&[3u32, 0, 36], &Device::Cpu).unwrap();
            let e: Vec<f32> = packed.embedding(&ids).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            assert_eq!(e[..k], want[3 * k..4 * k]);
            assert!(packed.embedding(&Tensor::new(&[37u32], &Device::Cpu).unwrap()).is_err());
        }
    }
}

/// Per output, the exact value (f64) of what every path computes before rounding — over
/// super-blocks, `d_x · (d · I − dmin · M)` with the integers of the module note, from the
/// unpacked blocks (whose values equal candle's, `the_repack_is_lossless`) — and the bound on
/// the f32 rounding: each super-block's term takes at most 6 roundings (the `i32 → f32`
/// conversions included) and the sum of `nsb` terms `nsb − 1` more.
fn exact_with_bound(p: &PackedK, xs: &QuantRows, r: usize) -> Vec<(f64, f64)> {
    let (nsb, bb) = (p.nsb(), p.kind.block_bytes());
    (0..p.n)
        .map(|i| {
            let (mut sum, mut abs) = (0f64, 0f64);
            for b in 0..nsb {
                let s = Super::get(p.kind, &p.tile(i / TN)[b * bb..][..bb], i % TN);
                let x = &xs.q[(r * nsb + b) * QK_K..][..QK_K];
                let (mut int, mut min) = (0i64, 0i64);
                for (v, &q) in s.q.iter().enumerate() {
                    let qw = if p.kind == Kind::Q6K { q as i64 - 32 } else { q as i64 };
                    let sc = if p.kind == Kind::Q6K { s.sc[v / 16] as i8 as i64 } else { s.sc[v / 32] as i64 };
                    int += sc * qw * x[v] as i64;
                    if p.kind != Kind::Q6K {
                        min += s.m[v / 32] as i64 * x[v] as i64;
                    }
                }
                let dx = xs.d[r * nsb + b] as f64;
                let (d, dmin) = (f16::from_bits(s.d).to_f64(), f16::from_bits(s.dmin).to_f64());
                sum += dx * (d * int as f64 - dmin * min as f64);
                abs += (dx * d * int as f64).abs() + (dx * dmin * min as f64).abs();
            }
            (sum, (nsb + 6) as f64 * f32::EPSILON as f64 * abs + f32::MIN_POSITIVE as f64)
        })
        .collect()
}

/// Per output: `Σ_j |w_j| · 0.6 · amax_256(j) / 127` plus a relative 1e-5 of `Σ |w_j x_j|`:
/// what quantizing the activation to 8 bits per 256 values (and rounding) may move a product
/// by: each value moves by at most half a step, a step being `amax / 127` of its block.
fn activation_quantization_bound(deq: &[f32], k: usize, x: &[f32]) -> Vec<f64> {
    let step: Vec<f64> = x
        .chunks(QK_K)
        .flat_map(|c| std::iter::repeat_n(0.6 * c.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0, c.len()))
        .collect();
    deq.chunks_exact(k)
        .map(|w| {
            let quant: f64 = w.iter().zip(&step).map(|(w, s)| w.abs() as f64 * s).sum();
            let mag: f64 = w.iter().zip(x).map(|(w, x)| (*w as f64 * *x as f64).abs()).sum();
            quant + 1e-5 * mag + 1e-6
        })
        .collect()
}

/// The product on every path (each must equal the portable one bit for bit), each batched
/// row equal to the same row alone.
fn every_path(p: &PackedK, x: &[f32], rows: usize) -> Vec<f32> {
    let (n, k) = (p.rows(), p.cols());
    let mut want = vec![0f32; rows * n];
    p.matmul_at(Path::Portable, x, rows, &mut want);
    for path in q8::paths() {
        let mut y = vec![0f32; rows * n];
        p.matmul_at(path, x, rows, &mut y);
        assert!(
            y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{path:?} {:?} [{n}x{k}] × {rows} rows differs from portable",
            p.kind
        );
        for r in [0, rows / 2, rows - 1] {
            let mut alone = vec![0f32; n];
            p.matmul_at(path, &x[r * k..(r + 1) * k], 1, &mut alone);
            assert_eq!(alone[..], y[r * n..(r + 1) * n], "{path:?} {:?} [{n}x{k}] row {r} of {rows}", p.kind);
        }
    }
    want
}

fn check(kind: Kind, n: usize, k: usize, rows: usize, seed: u64) {
    let mut rng = Lcg(seed);
    let dev = Device::Cpu;
    let w = Tensor::from_vec(rng.vec(n * k, 0.05), (n, k), &dev).unwrap();
    let q = QTensor::quantize(&w, kind.dtype()).unwrap();
    let packed = PackedK::from_qtensor(&q).unwrap();
    let deq = dequantized(&q);
    let xv = rng.vec(rows * k, 1.0);
    let x = Tensor::from_vec(xv.clone(), (rows, k), &dev).unwrap();
    // candle's kernels need SDOT on aarch64 (see `repack`); where there is none, only ours run.
    let candle: Option<Vec<f32>> = crate::model::repack::candle_dots_run_here()
        .then(|| QMatMul::from_qtensor(q).unwrap().forward(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap());
    let y = every_path(&packed, &xv, rows);
    let mut xs = QuantRows::default();
    xs.fill(&xv, rows, k);
    for r in 0..rows {
        for (i, (want, tol)) in exact_with_bound(&packed, &xs, r).into_iter().enumerate() {
            let got = y[r * n + i] as f64;
            assert!((got - want).abs() <= tol, "{kind:?} [{n}x{k}] row {r} out {i}: {got} vs exact {want} (bound {tol:e})");
        }
        // Against the dense product with the unquantized activation: ours, and candle's
        // (another arithmetic on the same blocks), within what 8-bit activations allow.
        let xr = &xv[r * k..(r + 1) * k];
        for (i, (wr, tol)) in deq.chunks_exact(k).zip(activation_quantization_bound(&deq, k, xr)).enumerate() {
            let truth: f64 = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
            let ours = y[r * n + i] as f64;
            assert!((ours - truth).abs() <= tol, "{kind:?} [{n}x{k}] out {i}: ours {ours} vs {truth} (bound {tol})");
            if let Some(candle) = &candle {
                let theirs = candle[r * n + i] as f64;
                assert!((theirs - truth).abs() <= tol, "{kind:?} [{n}x{k}] out {i}: candle {theirs} vs {truth} (bound {tol})");
            }
        }
    }
}

#[test]
fn every_path_matches_the_exact_product() {
    for kind in KINDS {
        for &(n, k, rows) in &[(1, 256, 1), (3, 512, 1), (17, 1024, 1), (130, 768, 1), (33, 256, 3), (40, 512, 5), (96, 768, 70)]
        {
            check(kind, n, k, rows, (n * k + rows) as u64);
        }
    }
}

/// The bound of `exact_with_bound` catches a wrong result: one super-block of one row
/// dropped moves the product far outside it.
#[test]
fn the_exact_bound_rejects_a_wrong_block() {
    let mut rng = Lcg(11);
    for kind in KINDS {
        let (n, k) = (16, 1024);
        let q = qtensor(kind, &random_blocks(kind, n, k, &mut rng), n, k);
        let packed = PackedK::from_qtensor(&q).unwrap();
        let x = rng.vec(k, 1.0);
        let mut xs = QuantRows::default();
        xs.fill(&x, 1, k);
        let (want, tol) = exact_with_bound(&packed, &xs, 0)[5];
        let mut broken = xs.q.clone();
        broken[..QK_K].iter_mut().for_each(|v| *v = 0);
        let mut xb = QuantRows { q: broken, d: xs.d.clone(), s16: xs.s16.clone(), s32: xs.s32.clone() };
        xb.s16[..16].iter_mut().for_each(|v| *v = 0);
        xb.s32[..8].iter_mut().for_each(|v| *v = 0);
        let (wrong, _) = exact_with_bound(&packed, &xb, 0)[5];
        assert!((wrong - want).abs() > 100.0 * tol, "{kind:?}: {wrong} vs {want} ± {tol}");
    }
}

/// Blocks of random bytes (any quant, scale and min, Q6_K scales of −128) on every path.
#[test]
fn random_blocks_on_every_path() {
    let mut rng = Lcg(3);
    for kind in KINDS {
        let (n, k, rows) = (35, 768, 9);
        let packed = PackedK::from_ggml_bytes(kind, &random_blocks(kind, n, k, &mut rng), n, k).unwrap();
        let x = rng.vec(rows * k, 2.0);
        let y = every_path(&packed, &x, rows);
        let mut xs = QuantRows::default();
        xs.fill(&x, rows, k);
        for r in 0..rows {
            for (i, (want, tol)) in exact_with_bound(&packed, &xs, r).into_iter().enumerate() {
                assert!((y[r * n + i] as f64 - want).abs() <= tol, "{kind:?} row {r} out {i}");
            }
        }
    }
}

/// The largest integers each format can hold against activations of ±127: no overflow and
/// no saturation on any path (AVX2's `maddubs` pairs are closest to their limit here).
#[test]
fn extreme_blocks_are_exact() {
    for kind in KINDS {
        let (n, k) = (19, 512);
        let gb = kind.ggml_bytes();
        let mut bytes = vec![0u8; n * k / QK_K * gb];
        for (i, b) in bytes.chunks_exact_mut(gb).enumerate() {
            let one = f16::from_f32(1.0 + (i % 7) as f32 / 8.0).to_le_bytes();
            match kind {
                Kind::Q4K | Kind::Q5K => {
                    b[..2].copy_from_slice(&one);
                    b[2..4].copy_from_slice(&one);
                    b[4..].iter_mut().for_each(|v| *v = 0xFF); // scales, mins and quants at their maximum
                }
                Kind::Q6K => {
                    // Quants 63 (or 0, i.e. −32) and scales of −128 and 127.
                    b[..192].iter_mut().for_each(|v| *v = if i % 2 == 0 { 0xFF } else { 0 });
                    b[192..208].iter_mut().enumerate().for_each(|(j, v)| *v = if j % 2 == 0 { 0x80 } else { 0x7F });
                    b[208..].copy_from_slice(&one);
                }
            }
        }
        let packed = PackedK::from_ggml_bytes(kind, &bytes, n, k).unwrap();
        // Activations of ±127 with their largest magnitude first, so the scale is exactly 1.
        let rows = 6;
        let x: Vec<f32> = (0..rows * k).map(|i| if (i / 3) % 2 == 0 { -127.0 } else { 127.0 }).collect();
        let y = every_path(&packed, &x, rows);
        let mut xs = QuantRows::default();
        xs.fill(&x, rows, k);
        assert!(xs.q.iter().all(|v| v.abs() == 127) && xs.d.iter().all(|&d| d.abs() == 1.0));
        for (i, (want, tol)) in exact_with_bound(&packed, &xs, 0).into_iter().enumerate() {
            assert!((y[i] as f64 - want).abs() <= tol, "{kind:?} out {i}: {} vs {want}", y[i]);
        }
    }
}

/// ggml's Q8_K quantizer: the first value of largest magnitude sets the scale (and its sign),
/// rounding is half to even, NaN gives 0, an all-zero block a zero scale.
#[test]
fn activations_quantize_as_ggml_does() {
    let mut x = vec![0f32; 4 * QK_K];
    // Block 0: max −127 → iscale 1: quants are the values rounded half to even.
    x[0] = -127.0;
    x[1..8].copy_from_slice(&[2.5, 3.5, -2.5, -0.5, 0.5, 1.49, f32::NAN]);
    // Block 1: +127 first, −127 later: the first sets iscale = −1.
    x[QK_K] = 127.0;
    x[QK_K + 1] = -127.0;
    x[QK_K + 2] = 10.0;
    // Block 2 stays zero; block 3 is tiny.
    x[3 * QK_K..].iter_mut().enumerate().for_each(|(i, v)| *v = i as f32 * 1e-30);
    let (mut q, mut d) = (vec![0i8; x.len()], vec![0f32; 4]);
    quantize_row(&x, &mut q, &mut d);
    assert_eq!(&q[..8], &[-127, 2, 4, -2, 0, 0, 1, 0]);
    assert_eq!(d[0], 1.0);
    assert_eq!(&q[QK_K..QK_K + 3], &[-127, 127, -10]);
    assert_eq!(d[1], -1.0);
    assert_eq!(d[2], 0.0);
    assert!(q[2 * QK_K..3 * QK_K].iter().all(|&v| v == 0));
    assert_eq!(q[4 * QK_K - 1], -127);
    assert!(d[3] < 0.0 && d[3].is_finite());
    // Sums per 16 and 32 values.
    let mut xs = QuantRows::default();
    xs.fill(&x, 1, x.len());
    assert_eq!(xs.s16[0], q[..16].iter().map(|&v| v as i16).sum::<i16>());
    assert_eq!(xs.s32[8], q[QK_K..QK_K + 32].iter().map(|&v| v as i16).sum::<i16>());
}

#[test]
fn bad_shapes_are_errors() {
    for kind in KINDS {
        let gb = kind.ggml_bytes();
        assert!(PackedK::from_ggml_bytes(kind, &vec![0u8; gb + 1], 1, 256).is_err());
        assert!(PackedK::from_ggml_bytes(kind, &[], 0, 256).is_err());
        assert!(PackedK::from_ggml_bytes(kind, &vec![0u8; gb], 1, 255).is_err());
        let huge = PackedK::from_ggml_bytes(kind, &[], usize::MAX / 2, 1 << 20).err().map(|e| e.code());
        assert_eq!(huge, Some("OUT_OF_MEMORY"));
    }
    let q8 = QTensor::quantize(&Tensor::zeros((2, 256), DType::F32, &Device::Cpu).unwrap(), GgmlDType::Q8_0).unwrap();
    assert!(PackedK::from_qtensor(&q8).is_err());
}

#[test]
fn zero_weights_and_activations() {
    for kind in KINDS {
        let (n, k) = (5, 256);
        let packed = PackedK::from_ggml_bytes(kind, &vec![0u8; n * kind.ggml_bytes()], n, k).unwrap();
        let mut y = vec![1f32; n];
        packed.matmul(&vec![0f32; k], 1, &mut y);
        assert!(y.iter().all(|v| *v == 0.0));
    }
}
