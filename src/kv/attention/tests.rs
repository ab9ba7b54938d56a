//! Tests of [`super`]: the fused kernel on every path and pool format against plain attention
//! and the generic path, the generic path's decode groups, row order and key tiles, the online
//! softmax past one key block, and the exact widening of half-precision rows.

use super::fused::{attend, KEY_BLOCK};
use super::generic::{generic_tiled, Tiling, TILING};
use super::rows::{widen, widen_bf16, KvView};
use super::*;
use crate::kv::quant::Quant;
use crate::kv::store::{slot_runs, SlotRun};
use crate::simd::Level;

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

/// Plain attention over contiguous K/V for one sequence: `[len, nh * hd]`.
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, pos: usize, nh: usize, nkv: usize, hd: usize) -> Tensor {
    let n = q.dim(0).unwrap();
    let total = k.dim(0).unwrap();
    let rep = nh / nkv;
    let mut rows = Vec::new();
    for i in 0..n {
        let mut heads = Vec::new();
        for h in 0..nh {
            let g = h / rep;
            let qh = q.narrow(0, i, 1).unwrap().narrow(1, h * hd, hd).unwrap();
            let see = pos + i + 1;
            let kh = k.narrow(0, 0, see).unwrap().narrow(1, g * hd, hd).unwrap();
            let vh = v.narrow(0, 0, see).unwrap().narrow(1, g * hd, hd).unwrap();
            let s = (qh.matmul(&kh.t().unwrap()).unwrap() * (1.0 / (hd as f64).sqrt())).unwrap();
            let p = candle_nn::ops::softmax_last_dim(&s).unwrap();
            heads.push(p.matmul(&vh).unwrap());
        }
        rows.push(Tensor::cat(&heads, 1).unwrap());
    }
    let _ = total;
    Tensor::cat(&rows, 0).unwrap()
}

#[test]
fn paged_kernel_and_generic_path_match_plain_attention() {
    let dev = Device::Cpu;
    for (nh, nkv, hd, bs) in [(8, 2, 16, 4), (4, 4, 64, 16), (8, 1, 128, 16)] {
        let store = KvStore::new(1, 12, bs, nkv, hd, DType::F32, &dev).unwrap();
        // Two sequences with scattered, non-contiguous blocks: a 5-row prompt chunk at
        // position 3 and a decode row at position 20.
        let tables: [Vec<BlockId>; 2] = [vec![7, 2], vec![0, 9, 4, 11, 1, 3]];
        let (pos, lens) = ([3usize, 20], [5usize, 1]);
        let mut kv_full = Vec::new();
        let mut runs = Vec::new();
        for (s, t) in tables.iter().enumerate() {
            let total = pos[s] + lens[s];
            let k = Tensor::randn(0f32, 1.0, (total, nkv * hd), &dev).unwrap();
            let v = Tensor::randn(0f32, 1.0, (total, nkv * hd), &dev).unwrap();
            let mut r = Vec::new();
            slot_runs(t, bs, 0, 0, total, &mut r);
            store.write(0, &r, &k, &v).unwrap();
            kv_full.push((k, v));
            runs.push(r);
        }
        let q = Tensor::randn(0f32, 1.0, (6, nh * hd), &dev).unwrap();
        let spans =
            [SeqSpan { row: 0, len: 5, pos: 3, blocks: &tables[0] }, SeqSpan { row: 5, len: 1, pos: 20, blocks: &tables[1] }];
        let want = Tensor::cat(
            &[
                reference(&q.narrow(0, 0, 5).unwrap(), &kv_full[0].0, &kv_full[0].1, 3, nh, nkv, hd),
                reference(&q.narrow(0, 5, 1).unwrap(), &kv_full[1].0, &kv_full[1].1, 20, nh, nkv, hd),
            ],
            0,
        )
        .unwrap();
        let plan = AttentionPlan::new(&spans, &store);
        let fused = cpu_f32(&q, &plan, &store, 0, nh, LayerAttention::FULL).unwrap().expect("kernel applies");
        let gen = generic(&q, &plan, &store, 0, nh, LayerAttention::FULL).unwrap();
        assert!(max_diff(&fused, &want) < 1e-5, "fused nh={nh} nkv={nkv} hd={hd}: {}", max_diff(&fused, &want));
        assert!(max_diff(&gen, &want) < 1e-5, "generic nh={nh} nkv={nkv} hd={hd}: {}", max_diff(&gen, &want));
        // Key tiles smaller than the chunk and not aligned with its first position: the
        // online softmax over several tiles equals the one-pass softmax.
        for tile in [1, 2, 3, 5] {
            let tiled =
                generic_tiled(&q, &plan, &store, 0, nh, LayerAttention::FULL, Tiling { key_tile: tile, ..TILING }).unwrap();
            assert!(max_diff(&tiled, &want) < 1e-5, "key tile {tile}: {}", max_diff(&tiled, &want));
        }
        // The portable path sums in the same order as the SIMD one.
        let (k, v) = store.layer(0);
        let (kd, vd): (Vec<f32>, Vec<f32>) =
            (k.flatten_all().unwrap().to_vec1().unwrap(), v.flatten_all().unwrap().to_vec1().unwrap());
        let qv: Vec<f32> = q.narrow(0, 5, 1).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let view = KvView { rows: Dense { k: &kd, v: &vd, at: (nkv * hd, 0, hd) }, blocks: &tables[1], bs, hd };
        let rep = nh / nkv;
        let mut a = vec![0f32; rep * hd];
        let mut sc = vec![0f32; rep * 21];
        attend(&qv[..rep * hd], &view, 20, 1, rep, 0.25, None, KEY_BLOCK, &mut sc, &mut a, Level::Portable);
        for level in crate::simd::levels() {
            let mut b = vec![0f32; rep * hd];
            attend(&qv[..rep * hd], &view, 20, 1, rep, 0.25, None, KEY_BLOCK, &mut sc, &mut b, level);
            assert_eq!(a, b, "{level:?}");
        }
        let _: &Vec<SlotRun> = &runs[0];
    }
}

/// The online softmax over key blocks equals the one-pass softmax, for blocks that split
/// a tile's own positions or not, on dense and quantized pools; every SIMD level sums the
/// blocked path in the same order.
#[test]
fn fused_kernel_key_blocks_match_one_pass() {
    let (nh, nkv, hd, bs) = (6, 2, 32, 4);
    let dev = Device::Cpu;
    for format in [KvFormat::Dense(DType::F32), KvFormat::Quant(Quant::Q8_0)] {
        let store = KvStore::new(1, 32, bs, nkv, hd, format, &dev).unwrap();
        let (tables, _) = scattered(&store, &[53, 20]);
        // A 37-row chunk (three tiles) at position 16 and a decode row at position 19.
        let spans =
            [SeqSpan { row: 0, len: 37, pos: 16, blocks: &tables[0] }, SeqSpan { row: 37, len: 1, pos: 19, blocks: &tables[1] }];
        let q = Tensor::randn(0f32, 1.0, (38, nh * hd), &dev).unwrap();
        let plan = AttentionPlan::new(&spans, &store);
        let want = cpu_f32(&q, &plan, &store, 0, nh, LayerAttention::FULL).unwrap().expect("kernel applies");
        for block in [1, 5, 16, 20, 41, 52] {
            let got = cpu_f32_blocks(&q, &plan, &store, 0, nh, LayerAttention::FULL, block).unwrap().expect("kernel applies");
            assert!(max_diff(&got, &want) < 1e-5, "{format:?} block {block}: {}", max_diff(&got, &want));
        }
    }
    let store = KvStore::new(1, 32, bs, nkv, hd, DType::F32, &dev).unwrap();
    let (tables, _) = scattered(&store, &[53]);
    let (k, v) = store.layer(0);
    let (kd, vd): (Vec<f32>, Vec<f32>) =
        (k.flatten_all().unwrap().to_vec1().unwrap(), v.flatten_all().unwrap().to_vec1().unwrap());
    let view = KvView { rows: Dense { k: &kd, v: &vd, at: (nkv * hd, hd, hd) }, blocks: &tables[0], bs, hd };
    let (p0, n, rep) = (41, 12, nh / nkv);
    let q: Vec<f32> = Tensor::randn(0f32, 1.0, n * rep * hd, &dev).unwrap().to_vec1().unwrap();
    for block in [5, 16] {
        let mut sc = vec![0f32; n * rep * block];
        let mut a = vec![0f32; n * rep * hd];
        attend(&q, &view, p0, n, rep, 0.2, None, block, &mut sc, &mut a, Level::Portable);
        for level in crate::simd::levels() {
            let mut b = vec![0f32; n * rep * hd];
            attend(&q, &view, p0, n, rep, 0.2, None, block, &mut sc, &mut b, level);
            assert_eq!(a, b, "block {block} {level:?}");
        }
    }
}

/// A row's attention has the same bits whether it runs in a prompt tile or alone (as a
/// decode step does), on dense and quantized pools, for head sizes the AVX2 micro-kernels
/// take (multiples of 8, past one gathered block of positions) and one they do not; and
/// every SIMD level gives the portable bits for a whole tile.
#[test]
fn a_row_attends_the_same_alone_or_in_a_tile() {
    let dev = Device::Cpu;
    let (nh, nkv, bs, total, p0) = (4, 2, 16, 150, 110);
    let n = total - p0;
    for (hd, format) in [
        (128, KvFormat::Dense(DType::F32)),
        (64, KvFormat::Dense(DType::F16)),
        (32, KvFormat::Quant(Quant::Q8_0)),
        (12, KvFormat::Dense(DType::F32)),
    ] {
        let store = KvStore::new(1, 16, bs, nkv, hd, format, &dev).unwrap();
        let (tables, _) = scattered(&store, &[total]);
        let q = Tensor::randn(0f32, 1.0, (n, nh * hd), &dev).unwrap();
        let tile = [SeqSpan { row: 0, len: n, pos: p0, blocks: &tables[0] }];
        let alone: Vec<SeqSpan> = (0..n).map(|r| SeqSpan { row: r, len: 1, pos: p0 + r, blocks: &tables[0] }).collect();
        let a = cpu_f32(&q, &AttentionPlan::new(&tile, &store), &store, 0, nh, LayerAttention::FULL)
            .unwrap()
            .expect("kernel applies");
        let b = cpu_f32(&q, &AttentionPlan::new(&alone, &store), &store, 0, nh, LayerAttention::FULL)
            .unwrap()
            .expect("kernel applies");
        let (a, b): (Vec<f32>, Vec<f32>) =
            (a.flatten_all().unwrap().to_vec1().unwrap(), b.flatten_all().unwrap().to_vec1().unwrap());
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "hd {hd} {format:?}");
    }
    let (hd, rep, n) = (128, nh / nkv, 16);
    let store = KvStore::new(1, 16, bs, nkv, hd, DType::F32, &dev).unwrap();
    let (tables, _) = scattered(&store, &[total]);
    let (k, v) = store.layer(0);
    let (kd, vd): (Vec<f32>, Vec<f32>) =
        (k.flatten_all().unwrap().to_vec1().unwrap(), v.flatten_all().unwrap().to_vec1().unwrap());
    let view = KvView { rows: Dense { k: &kd, v: &vd, at: (nkv * hd, hd, hd) }, blocks: &tables[0], bs, hd };
    let q: Vec<f32> = Tensor::randn(0f32, 1.0, n * rep * hd, &dev).unwrap().to_vec1().unwrap();
    let p0 = total - n;
    let mut sc = vec![0f32; n * rep * total];
    let mut a = vec![0f32; n * rep * hd];
    attend(&q, &view, p0, n, rep, 0.1, None, KEY_BLOCK, &mut sc, &mut a, Level::Portable);
    for level in crate::simd::levels() {
        let mut b = vec![0f32; n * rep * hd];
        attend(&q, &view, p0, n, rep, 0.1, None, KEY_BLOCK, &mut sc, &mut b, level);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{level:?}");
    }
}

/// Writes random K/V for sequences of `totals` positions, each through its own scattered
/// blocks; returns the tables and the contiguous K/V.
fn scattered(store: &KvStore, totals: &[usize]) -> (Vec<Vec<BlockId>>, Vec<(Tensor, Tensor)>) {
    let (bs, width) = (store.block_size, store.kv_heads * store.head_dim);
    let mut free: Vec<BlockId> = (0..store.num_blocks as BlockId).rev().collect();
    // Interleave the sequences' blocks so no table is contiguous.
    free.sort_by_key(|b| (b % 3, *b));
    let (mut tables, mut kv) = (Vec::new(), Vec::new());
    for &total in totals {
        let t: Vec<BlockId> = (0..total.div_ceil(bs)).map(|_| free.pop().expect("pool large enough")).collect();
        let k = Tensor::randn(0f32, 1.0, (total, width), &Device::Cpu).unwrap();
        let v = Tensor::randn(0f32, 1.0, (total, width), &Device::Cpu).unwrap();
        let mut r = Vec::new();
        slot_runs(&t, bs, 0, 0, total, &mut r);
        store.write(0, &r, &k, &v).unwrap();
        tables.push(t);
        kv.push((k, v));
    }
    (tables, kv)
}

/// Decode rows of different lengths, out of length order, after a prompt chunk: the generic
/// path batches them (padding masked) and puts every row back in place.
#[test]
fn generic_path_batches_decode_rows_of_different_lengths() {
    let (nh, nkv, hd, bs) = (8, 2, 16, 4);
    let totals = [9usize, 41, 4, 18, 1, 30];
    let store = KvStore::new(1, 64, bs, nkv, hd, DType::F32, &Device::Cpu).unwrap();
    let (tables, kv) = scattered(&store, &totals);
    // Rows: seq 0 is a 3-row chunk ending at position 8; the others decode one row each.
    let mut spans = vec![SeqSpan { row: 0, len: 3, pos: 6, blocks: &tables[0] }];
    for (i, &t) in totals.iter().enumerate().skip(1) {
        spans.push(SeqSpan { row: 2 + i, len: 1, pos: t - 1, blocks: &tables[i] });
    }
    let q = Tensor::randn(0f32, 1.0, (8, nh * hd), &Device::Cpu).unwrap();
    let plan = AttentionPlan::new(&spans, &store);
    let got = generic(&q, &plan, &store, 0, nh, LayerAttention::FULL).unwrap();
    let fused = cpu_f32(&q, &plan, &store, 0, nh, LayerAttention::FULL).unwrap().expect("f32 on CPU");
    for s in &spans {
        let i = spans.iter().position(|x| x.row == s.row).unwrap();
        let want = reference(&q.narrow(0, s.row, s.len).unwrap(), &kv[i].0, &kv[i].1, s.pos, nh, nkv, hd);
        let row = got.narrow(0, s.row, s.len).unwrap();
        assert!(max_diff(&row, &want) < 1e-5, "sequence {i}: {}", max_diff(&row, &want));
    }
    assert!(max_diff(&got, &fused) < 1e-5);
    assert!(plan.generic(&store, &Device::Cpu, TILING).unwrap().perm.is_some(), "rows are not in group order");
}

/// Long sequences split into several decode groups (each within `TILING.decode_positions`);
/// the fused kernel's key blocks on the longest.
#[test]
fn generic_path_splits_long_decode_batches_into_groups() {
    let (nh, nkv, hd, bs) = (2, 1, 4, 16);
    let totals = [20_000usize, 9_000, 15_000];
    let store = KvStore::new(1, 45_000 / bs, bs, nkv, hd, DType::F32, &Device::Cpu).unwrap();
    let (tables, kv) = scattered(&store, &totals);
    let spans: Vec<SeqSpan> =
        totals.iter().enumerate().map(|(i, &t)| SeqSpan { row: i, len: 1, pos: t - 1, blocks: &tables[i] }).collect();
    let q = Tensor::randn(0f32, 1.0, (3, nh * hd), &Device::Cpu).unwrap();
    let plan = AttentionPlan::new(&spans, &store);
    assert_eq!(plan.generic(&store, &Device::Cpu, TILING).unwrap().decode.len(), 2);
    let got = generic(&q, &plan, &store, 0, nh, LayerAttention::FULL).unwrap();
    // The fused kernel too: 20,000 positions take its online softmax over key blocks.
    assert!(totals[0] > KEY_BLOCK);
    let fused = cpu_f32(&q, &plan, &store, 0, nh, LayerAttention::FULL).unwrap().expect("f32 on CPU");
    for (i, s) in spans.iter().enumerate() {
        let want = reference(&q.narrow(0, i, 1).unwrap(), &kv[i].0, &kv[i].1, s.pos, nh, nkv, hd);
        let d = max_diff(&got.narrow(0, i, 1).unwrap(), &want);
        assert!(d < 1e-5, "sequence {i}: {d}");
        let d = max_diff(&fused.narrow(0, i, 1).unwrap(), &want);
        assert!(d < 1e-5, "fused, sequence {i}: {d}");
    }
}

/// A decode row longer than a group's bound runs like a one-row chunk over key tiles; the
/// shorter rows beside it stay grouped. Every row equals plain attention.
#[test]
fn generic_path_tiles_decode_rows_longer_than_a_group() {
    let (nh, nkv, hd, bs) = (4, 2, 8, 4);
    let totals = [50usize, 7, 23, 3, 12];
    let store = KvStore::new(1, 32, bs, nkv, hd, DType::F32, &Device::Cpu).unwrap();
    let (tables, kv) = scattered(&store, &totals);
    let spans: Vec<SeqSpan> =
        totals.iter().enumerate().map(|(i, &t)| SeqSpan { row: i, len: 1, pos: t - 1, blocks: &tables[i] }).collect();
    let q = Tensor::randn(0f32, 1.0, (5, nh * hd), &Device::Cpu).unwrap();
    for decode_positions in [16, 8, 5] {
        let tiling = Tiling { key_tile: 3, decode_positions };
        let plan = AttentionPlan::new(&spans, &store);
        let got = generic_tiled(&q, &plan, &store, 0, nh, LayerAttention::FULL, tiling).unwrap();
        let g = plan.generic(&store, &Device::Cpu, tiling).unwrap();
        let tiled = totals.iter().filter(|&&t| t > decode_positions).count();
        assert_eq!(g.chunks.len(), tiled, "rows past {decode_positions} positions are tiled");
        assert!(!g.decode.is_empty(), "the short rows stay grouped");
        for (i, s) in spans.iter().enumerate() {
            let want = reference(&q.narrow(0, i, 1).unwrap(), &kv[i].0, &kv[i].1, s.pos, nh, nkv, hd);
            let d = max_diff(&got.narrow(0, i, 1).unwrap(), &want);
            assert!(d < 1e-5, "decode_positions {decode_positions}, sequence {i}: {d}");
        }
    }
}

/// Half-precision and block-quantized pools: the fused kernel (rows widened or
/// dequantized as read) equals the generic path (rows converted once gathered), each
/// stays within its bound of the f32 pool, and the finer formats are nearer.
#[test]
fn narrow_pools_in_the_fused_kernel() {
    let (nh, nkv, hd, bs) = (8, 2, 64, 4);
    let totals = [9usize, 30];
    let f32_store = KvStore::new(1, 16, bs, nkv, hd, DType::F32, &Device::Cpu).unwrap();
    let (tables, kv) = scattered(&f32_store, &totals);
    let spans = [SeqSpan { row: 0, len: 3, pos: 6, blocks: &tables[0] }, SeqSpan { row: 3, len: 1, pos: 29, blocks: &tables[1] }];
    let q = Tensor::randn(0f32, 1.0, (4, nh * hd), &Device::Cpu).unwrap();
    let plan = AttentionPlan::new(&spans, &f32_store);
    let exact = cpu_f32(&q, &plan, &f32_store, 0, nh, LayerAttention::FULL).unwrap().expect("f32 pool");
    let formats = [
        (KvFormat::Dense(DType::F16), 0.01),
        (KvFormat::Dense(DType::BF16), 0.05),
        (KvFormat::Quant(Quant::Q8_0), 0.05),
        (KvFormat::Quant(Quant::Q4_0), 0.5),
    ];
    let mut errs = Vec::new();
    for (format, bound) in formats {
        let store = KvStore::new(1, 16, bs, nkv, hd, format, &Device::Cpu).unwrap();
        assert_eq!(store.bytes_per_token(), 2 * format.row_bytes(nkv * hd));
        for (t, (k, v)) in tables.iter().zip(&kv) {
            let mut r = Vec::new();
            slot_runs(t, bs, 0, 0, k.dim(0).unwrap(), &mut r);
            store.write(0, &r, k, v).unwrap();
        }
        let plan = AttentionPlan::new(&spans, &store);
        let fused = cpu_f32(&q, &plan, &store, 0, nh, LayerAttention::FULL).unwrap().expect("the kernel reads every pool format");
        let gen = generic(&q, &plan, &store, 0, nh, LayerAttention::FULL).unwrap();
        assert!(max_diff(&fused, &gen) < 1e-5, "{format:?}: {}", max_diff(&fused, &gen));
        let d = max_diff(&fused, &exact);
        assert!(d > 0.0 && d < bound, "{format:?} against f32: {d}");
        errs.push(d);
    }
    assert!(errs[0] < errs[2] && errs[2] < errs[3], "f16 < q8_0 < q4_0: {errs:?}");
}

/// The f16 and bf16 widening the kernel reads through gives every value exactly (NaN as a
/// NaN), in rows of any length.
#[test]
fn widening_is_exact_for_every_half() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let f16s: Vec<half::f16> = all.iter().map(|&b| half::f16::from_bits(b)).collect();
    let bf16s: Vec<half::bf16> = all.iter().map(|&b| half::bf16::from_bits(b)).collect();
    for len in [all.len(), 13, 8, 1] {
        let mut got = vec![0f32; len];
        widen(&f16s[..len], &mut got);
        for (v, g) in f16s.iter().zip(&got) {
            assert!(v.to_f32().to_bits() == g.to_bits() || (v.is_nan() && g.is_nan()), "f16 {:#06x}", v.to_bits());
        }
        widen_bf16(&bf16s[..len], &mut got);
        for (v, g) in bf16s.iter().zip(&got) {
            assert!(v.to_f32().to_bits() == g.to_bits() || (v.is_nan() && g.is_nan()), "bf16 {:#06x}", v.to_bits());
        }
    }
}

#[test]
fn other_dtypes_take_the_generic_path() {
    let dev = Device::Cpu;
    let store = KvStore::new(1, 2, 4, 1, 8, DType::F16, &dev).unwrap();
    let q = Tensor::zeros((1, 16), DType::F16, &dev).unwrap();
    let blocks = [1u32];
    let spans = [SeqSpan { row: 0, len: 1, pos: 0, blocks: &blocks }];
    let plan = AttentionPlan::new(&spans, &store);
    assert!(cpu_f32(&q, &plan, &store, 0, 2, LayerAttention::FULL).unwrap().is_none());
    let out = paged_attention(&q, &plan, &store, 0, 2, LayerAttention::FULL).unwrap();
    assert_eq!(out.dims(), &[1, 16]);
}
