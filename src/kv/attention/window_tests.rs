//! Tests of sliding-window attention and a score scale other than `1/√head_dim` in the fused
//! kernel: against plain windowed attention, over key blocks, alone or in a tile, on every SIMD
//! level; positions before a tile's window are never read (they may hold anything, as blocks
//! given back to the pool will); the generic path's windows; a window of 0 is refused.

use super::fused::{attend, first_seen};
use super::generic::{generic_tiled, Tiling};
use super::rows::{Dense, KvView};
use super::*;
use crate::kv::store::slot_runs;
use crate::simd::Level;

const DEV: Device = Device::Cpu;

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

/// Plain attention of the rows of `q` (the first at position `pos`) over contiguous K/V, each
/// row seeing the last `window` positions up to itself, at `scale`: `[rows, nh * hd]`.
#[allow(clippy::too_many_arguments)]
fn windowed(q: &Tensor, k: &Tensor, v: &Tensor, pos: usize, nh: usize, nkv: usize, window: usize, scale: f64) -> Tensor {
    let hd = k.dim(1).unwrap() / nkv;
    let rows: Vec<Tensor> = (0..q.dim(0).unwrap())
        .map(|i| {
            let (lo, hi) = (first_seen(pos + i, Some(window)), pos + i + 1);
            let heads: Vec<Tensor> = (0..nh)
                .map(|h| {
                    let g = h / (nh / nkv);
                    let qh = q.narrow(0, i, 1).unwrap().narrow(1, h * hd, hd).unwrap();
                    let kh = k.narrow(0, lo, hi - lo).unwrap().narrow(1, g * hd, hd).unwrap();
                    let vh = v.narrow(0, lo, hi - lo).unwrap().narrow(1, g * hd, hd).unwrap();
                    let s = (qh.matmul(&kh.t().unwrap()).unwrap() * scale).unwrap();
                    candle_nn::ops::softmax_last_dim(&s).unwrap().matmul(&vh).unwrap()
                })
                .collect();
            Tensor::cat(&heads, 1).unwrap()
        })
        .collect();
    Tensor::cat(&rows, 0).unwrap()
}

/// A pool of one layer holding random K/V for sequences of `totals` positions, each through its
/// own interleaved blocks.
fn pool(
    format: KvFormat,
    nkv: usize,
    hd: usize,
    bs: usize,
    totals: &[usize],
) -> (KvStore, Vec<Vec<BlockId>>, Vec<(Tensor, Tensor)>) {
    let store = KvStore::new(1, 64, bs, nkv, hd, format, &DEV).unwrap();
    let mut next = 0;
    let (mut tables, mut kv) = (Vec::new(), Vec::new());
    for &total in totals {
        let blocks = total.div_ceil(bs);
        // Every other block, from the back: no table is contiguous.
        let t: Vec<BlockId> = (0..blocks).map(|i| (63 - 2 * (next + i) % 63) as BlockId).collect();
        next += blocks;
        let k = crate::kv::seeded(total, nkv * hd, 2 * next as u64);
        let v = crate::kv::seeded(total, nkv * hd, 2 * next as u64 + 1);
        let mut runs = Vec::new();
        slot_runs(&t, bs, 0, 0, total, &mut runs);
        store.write(0, &runs, &k, &v).unwrap();
        tables.push(t);
        kv.push((k, v));
    }
    (store, tables, kv)
}

#[test]
fn a_window_attends_the_last_positions_only() {
    let (nh, nkv, hd, bs) = (6, 2, 32, 4);
    // A 37-row chunk (three tiles) at position 16 and a decode row at position 50.
    let (store, tables, kv) = pool(KvFormat::Dense(DType::F32), nkv, hd, bs, &[53, 51]);
    let spans =
        [SeqSpan { row: 0, len: 37, pos: 16, blocks: &tables[0] }, SeqSpan { row: 37, len: 1, pos: 50, blocks: &tables[1] }];
    let plan = AttentionPlan::new(&spans, &store);
    let q = crate::kv::seeded(38, nh * hd, 3);
    for window in [1, 2, 7, 8, 16, 17, 40, 52, 53, 1000] {
        for scale in [None, Some(0.3f32)] {
            let how = LayerAttention { scale, window: Some(window) };
            let s = scale.map_or(1.0 / (hd as f64).sqrt(), f64::from);
            let want = Tensor::cat(
                &[
                    windowed(&q.narrow(0, 0, 37).unwrap(), &kv[0].0, &kv[0].1, 16, nh, nkv, window, s),
                    windowed(&q.narrow(0, 37, 1).unwrap(), &kv[1].0, &kv[1].1, 50, nh, nkv, window, s),
                ],
                0,
            )
            .unwrap();
            let got = paged_attention(&q, &plan, &store, 0, nh, how).unwrap();
            assert!(max_diff(&got, &want) < 1e-5, "window {window} scale {scale:?}: {}", max_diff(&got, &want));
            // The online softmax over key blocks, blocks splitting the window or not.
            for block in [1, 3, 5, 16, 41] {
                let blocked = cpu_f32_blocks(&q, &plan, &store, 0, nh, how, block).unwrap().expect("kernel applies");
                assert!(max_diff(&blocked, &want) < 1e-5, "window {window} block {block}: {}", max_diff(&blocked, &want));
            }
        }
    }
    // A window that covers every position is full attention, to the bit.
    let full = paged_attention(&q, &plan, &store, 0, nh, LayerAttention::FULL).unwrap();
    let wide = paged_attention(&q, &plan, &store, 0, nh, LayerAttention { scale: None, window: Some(53) }).unwrap();
    assert_eq!(full.to_vec2::<f32>().unwrap(), wide.to_vec2::<f32>().unwrap());
}

/// Positions before a tile's window may hold anything (NaN here): they are never read. On
/// every pool format, the result equals that of the pool with their true values.
#[test]
fn positions_before_the_window_are_never_read() {
    let (nh, nkv, hd, bs) = (4, 2, 32, 4);
    for format in [
        KvFormat::Dense(DType::F32),
        KvFormat::Dense(DType::F16),
        KvFormat::Dense(DType::BF16),
        KvFormat::Quant(crate::kv::quant::Quant::Q8_0),
    ] {
        let (store, tables, _) = pool(format, nkv, hd, bs, &[61, 45]);
        let spans =
            [SeqSpan { row: 0, len: 20, pos: 41, blocks: &tables[0] }, SeqSpan { row: 20, len: 1, pos: 44, blocks: &tables[1] }];
        let plan = AttentionPlan::new(&spans, &store);
        let q = crate::kv::seeded(21, nh * hd, 4);
        let how = LayerAttention { scale: None, window: Some(9) };
        let clean = paged_attention(&q, &plan, &store, 0, nh, how).unwrap();
        // Poison what neither tile's first row sees: positions ..33 of the chunk (its first row
        // is at 41) and ..36 of the decode row.
        for (t, upto) in [(&tables[0], first_seen(41, how.window)), (&tables[1], first_seen(44, how.window))] {
            let nan = Tensor::full(f32::NAN, (upto, nkv * hd), &DEV).unwrap();
            let mut runs = Vec::new();
            slot_runs(t, bs, 0, 0, upto, &mut runs);
            store.write(0, &runs, &nan, &nan).unwrap();
        }
        let poisoned = paged_attention(&q, &plan, &store, 0, nh, how).unwrap();
        assert_eq!(clean.to_vec2::<f32>().unwrap(), poisoned.to_vec2::<f32>().unwrap(), "{format:?}");
    }
}

/// A row's windowed attention has the same bits alone (a decode step) or in a prompt tile,
/// and every SIMD level gives the portable bits.
#[test]
fn a_windowed_row_attends_the_same_alone_in_a_tile_and_on_every_level() {
    let (nh, nkv, hd, bs) = (4, 1, 64, 8);
    let (store, tables, _) = pool(KvFormat::Dense(DType::F32), nkv, hd, bs, &[40]);
    let q = crate::kv::seeded(12, nh * hd, 5);
    let how = LayerAttention { scale: Some(0.125), window: Some(10) };
    let tile = [SeqSpan { row: 0, len: 12, pos: 28, blocks: &tables[0] }];
    let a = paged_attention(&q, &AttentionPlan::new(&tile, &store), &store, 0, nh, how).unwrap();
    for r in [0, 5, 11] {
        let alone = [SeqSpan { row: 0, len: 1, pos: 28 + r, blocks: &tables[0] }];
        let b = paged_attention(&q.narrow(0, r, 1).unwrap(), &AttentionPlan::new(&alone, &store), &store, 0, nh, how).unwrap();
        assert_eq!(a.narrow(0, r, 1).unwrap().to_vec2::<f32>().unwrap(), b.to_vec2::<f32>().unwrap(), "row {r}");
    }
    let (k, v) = store.layer(0);
    let (kd, vd): (Vec<f32>, Vec<f32>) =
        (k.flatten_all().unwrap().to_vec1().unwrap(), v.flatten_all().unwrap().to_vec1().unwrap());
    let view = KvView { rows: Dense { k: &kd, v: &vd, at: store.head_rows(0, 0, hd) }, blocks: &tables[0], bs, hd };
    let qv: Vec<f32> = q.flatten_all().unwrap().to_vec1().unwrap();
    for block in [4, 1 << 14] {
        let mut sc = vec![0f32; 12 * nh * 40];
        let mut want = vec![0f32; 12 * nh * hd];
        attend(&qv, &view, 28, 12, nh, 0.125, Some(10), block, &mut sc, &mut want, Level::Portable);
        for level in crate::simd::levels() {
            let mut got = vec![0f32; 12 * nh * hd];
            attend(&qv, &view, 28, 12, nh, 0.125, Some(10), block, &mut sc, &mut got, level);
            assert_eq!(want, got, "block {block} {level:?}");
        }
    }
}

/// A window of 0 positions is refused, not run as full attention.
#[test]
fn a_window_of_nothing_is_refused() {
    let (store, tables, _) = pool(KvFormat::Dense(DType::F32), 1, 16, 4, &[8]);
    let spans = [SeqSpan { row: 0, len: 1, pos: 7, blocks: &tables[0] }];
    let plan = AttentionPlan::new(&spans, &store);
    let q = crate::kv::seeded(1, 32, 6);
    for q in [q.clone(), q.to_dtype(DType::BF16).unwrap()] {
        let zero = paged_attention(&q, &plan, &store, 0, 2, LayerAttention { scale: None, window: Some(0) }).unwrap_err();
        assert_eq!(zero.code(), "INVALID_ARGUMENT");
    }
}

/// The generic path (any device or dtype) takes windows and scales too: a prompt chunk over
/// key tiles that split the window or not, decode rows batched in a padded group, and a decode
/// row long enough to run tiled; f32 against plain windowed attention, bf16 queries within
/// bf16's precision.
#[test]
fn the_generic_path_attends_the_window_too() {
    let (nh, nkv, hd, bs) = (6, 2, 32, 4);
    let (store, tables, kv) = pool(KvFormat::Dense(DType::F32), nkv, hd, bs, &[53, 51, 10]);
    let spans = [
        SeqSpan { row: 0, len: 37, pos: 16, blocks: &tables[0] },
        SeqSpan { row: 37, len: 1, pos: 50, blocks: &tables[1] },
        SeqSpan { row: 38, len: 1, pos: 9, blocks: &tables[2] },
    ];
    let plan = AttentionPlan::new(&spans, &store);
    let q = crate::kv::seeded(39, nh * hd, 7);
    for window in [1, 2, 7, 10, 17, 40, 53, 1000] {
        for scale in [None, Some(0.3f32)] {
            let how = LayerAttention { scale, window: Some(window) };
            let s = scale.map_or(1.0 / (hd as f64).sqrt(), f64::from);
            let part = |row: usize, len: usize, seq: usize, pos: usize| {
                windowed(&q.narrow(0, row, len).unwrap(), &kv[seq].0, &kv[seq].1, pos, nh, nkv, window, s)
            };
            let want = Tensor::cat(&[part(0, 37, 0, 16), part(37, 1, 1, 50), part(38, 1, 2, 9)], 0).unwrap();
            for (key_tile, decode_positions) in [(1024, 1 << 15), (3, 1 << 15), (16, 40), (5, 20)] {
                let tiling = Tiling { key_tile, decode_positions };
                // Each tiling builds its own plan (the plan caches the generic layout).
                let plan = AttentionPlan::new(&spans, &store);
                let got = generic_tiled(&q, &plan, &store, 0, nh, how, tiling).unwrap();
                let d = max_diff(&got, &want);
                assert!(d < 1e-5, "window {window} scale {scale:?} tiles {key_tile}/{decode_positions}: {d}");
            }
            let bf16 = q.to_dtype(DType::BF16).unwrap();
            let got = paged_attention(&bf16, &plan, &store, 0, nh, how).unwrap().to_dtype(DType::F32).unwrap();
            assert!(max_diff(&got, &want) < 0.05, "bf16 window {window}: {}", max_diff(&got, &want));
        }
    }
}
