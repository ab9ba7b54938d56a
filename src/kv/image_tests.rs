//! Table images without a model: written blocks come back bit for bit in every pool format and
//! either layout, a recurrent state comes back standing where it stood, and images that do not
//! fit are refused before anything is allocated.

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::kv::layers::{KvLayout, LayerCache};
use crate::kv::quant::Quant as KvQuant;
use crate::kv::store::{slot_runs, KvFormat};

const BS: usize = 4;
const LAYERS: usize = 2;
const HEADS: usize = 2;
const DIM: usize = 32;

fn manager(format: KvFormat, head_major: bool, blocks: usize) -> KvManager {
    let store = KvStore::with_layout(LAYERS, blocks, BS, HEADS, DIM, format, &Device::Cpu, head_major).unwrap();
    KvManager::new(store, true)
}

fn formats() -> Vec<KvFormat> {
    vec![
        KvFormat::Dense(DType::F32),
        KvFormat::Dense(DType::F16),
        KvFormat::Dense(DType::BF16),
        KvFormat::Quant(KvQuant::Q8_0),
        KvFormat::Quant(KvQuant::Q4_0),
    ]
}

/// A table of `len` positions whose every layer holds seeded values.
fn filled(m: &mut KvManager, len: usize, seed: u64) -> BlockTable {
    let mut t = BlockTable::default();
    assert!(m.resume(&mut t, 0, blocks_for(len, BS)).unwrap());
    let mut runs = Vec::new();
    slot_runs(t.blocks(), BS, 0, 0, len, &mut runs);
    for layer in 0..LAYERS {
        let vals = |k: u64| -> Tensor {
            let v: Vec<f32> = (0..len * HEADS * DIM)
                .map(|i| (((i as u64 * 2654435761 + seed * 97 + k) % 1000) as f32 - 500.0) / 100.0)
                .collect();
            Tensor::from_vec(v, (len, HEADS * DIM), &Device::Cpu).unwrap()
        };
        m.store().write(layer, &runs, &vals(layer as u64), &vals(layer as u64 + 7)).unwrap();
    }
    t.advance(len);
    t
}

/// Every layer's K and V at the table's positions, read through the pool's own gather.
fn contents(m: &KvManager, t: &BlockTable) -> Vec<Vec<f32>> {
    let idx: Vec<u32> = (0..t.len()).map(|p| crate::kv::store::slot_of(t.blocks(), BS, p) as u32).collect();
    let idx = Tensor::new(idx.as_slice(), &Device::Cpu).unwrap();
    let mut out = Vec::new();
    for layer in 0..LAYERS {
        let (k, v) = m.store().gather(layer, &idx, DType::F32).unwrap();
        out.push(k.flatten_all().unwrap().to_vec1().unwrap());
        out.push(v.flatten_all().unwrap().to_vec1().unwrap());
    }
    out
}

#[test]
fn a_table_comes_back_bit_for_bit_in_every_format_and_across_layouts() {
    for format in formats() {
        for (from_hm, to_hm) in [(true, true), (false, false), (true, false), (false, true)] {
            let mut a = manager(format, from_hm, 16);
            let t = filled(&mut a, 10, 3);
            let image = a.export_table(&t).unwrap();
            assert_eq!((image.len, image.blocks.len(), image.state.as_ref()), (10, 3, None));
            assert!(image.blocks.iter().all(|b| b.len() == a.store().bytes_per_block()));
            let mut b = manager(format, to_hm, 16);
            // Another table first, so the restored one sits on other block ids.
            let _other = filled(&mut b, 5, 9);
            let u = b.import_table(&image).unwrap().expect("room");
            assert_eq!(u.len(), 10);
            assert_ne!(u.blocks()[0], t.blocks()[0]);
            let (want, got) = (contents(&a, &t), contents(&b, &u));
            assert!(want == got, "{} {from_hm}->{to_hm}: restored values differ", format.name());
            // The image of the restored table is the image saved.
            assert_eq!(b.export_table(&u).unwrap(), image);
        }
    }
}

#[test]
fn images_that_do_not_fit_are_refused_before_allocating() {
    let mut a = manager(KvFormat::Dense(DType::F32), true, 16);
    let t = filled(&mut a, 6, 1);
    let image = a.export_table(&t).unwrap();
    // Another format's blocks are of another size.
    let mut q = manager(KvFormat::Quant(KvQuant::Q8_0), true, 16);
    let used = q.used_blocks();
    assert!(matches!(q.import_table(&image), Err(EngineError::InvalidArgument(_))));
    assert_eq!(q.used_blocks(), used);
    // A short block, a missing block, a state the model has no place for.
    let mut b = manager(KvFormat::Dense(DType::F32), true, 16);
    for bad in [
        TableImage { blocks: vec![image.blocks[0].clone(), image.blocks[1][1..].to_vec()], ..image.clone() },
        TableImage { blocks: vec![image.blocks[0].clone()], ..image.clone() },
        TableImage { state: Some(vec![0.0; 4]), ..image.clone() },
    ] {
        assert!(matches!(b.import_table(&bad), Err(EngineError::InvalidArgument(_))), "{bad:?}");
        assert_eq!(b.used_blocks(), 0);
    }
    // More positions than the pool has: exhausted; fewer free blocks than needed: no room yet.
    let mut small = manager(KvFormat::Dense(DType::F32), true, 1);
    assert!(matches!(small.import_table(&image), Err(EngineError::KvCacheExhausted(_))));
    let mut busy = manager(KvFormat::Dense(DType::F32), true, 3);
    let _held = filled(&mut busy, 8, 2);
    assert!(busy.import_table(&image).unwrap().is_none());
}

#[test]
fn a_recurrent_state_comes_back_standing_where_it_stood() {
    let layout = KvLayout::from_kinds(&[LayerCache::State { bytes: 16 }, LayerCache::Full]);
    let make = || {
        let store = KvStore::new(2, 8, BS, 1, 1, DType::F32, &Device::Cpu)
            .unwrap()
            .with_cache_layout(layout.clone())
            .unwrap()
            .with_state_slots(2, 0)
            .unwrap();
        KvManager::new(store, true)
    };
    let mut a = make();
    let mut t = BlockTable::default();
    assert!(a.resume(&mut t, 0, 2).unwrap());
    a.store()
        .states()
        .with_layer(t.state().unwrap(), 0, (0, 5), false, |s, _| {
            s.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32 + 0.5);
            Ok(())
        })
        .unwrap();
    t.advance(5);
    let image = a.export_table(&t).unwrap();
    assert_eq!(image.state, Some(vec![0.5, 1.5, 2.5, 3.5]));
    let mut b = make();
    let u = b.import_table(&image).unwrap().unwrap();
    // The next pass continues at 5; one at any other position is refused.
    let got = b.store().states().with_layer(u.state().unwrap(), 0, (5, 0), false, |s, _| Ok(s.to_vec())).unwrap();
    assert_eq!(got, vec![0.5, 1.5, 2.5, 3.5]);
    assert!(b.store().states().with_layer(u.state().unwrap(), 0, (4, 1), false, |_, _| Ok(())).is_err());
    // A state that stands elsewhere than the table's length is not exported.
    let mut short = t;
    short.advance(6);
    assert!(a.export_table(&short).is_err());
}

#[test]
fn a_model_with_a_sliding_window_is_refused_with_the_reason() {
    let layout = KvLayout::from_kinds(&[LayerCache::Window { window: 8 }, LayerCache::Full]);
    let store = KvStore::new(2, 8, BS, 1, 32, DType::F32, &Device::Cpu).unwrap().with_cache_layout(layout).unwrap();
    let m = KvManager::new(store, true);
    let e = m.export_table(&BlockTable::default()).unwrap_err();
    assert!(e.to_string().contains("sliding window"), "{e}");
}
