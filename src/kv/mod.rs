//! Key/value caches. They live outside the model: one pool of fixed-size blocks holds every
//! sequence's keys and values, and the decoder is handed each sequence's block table.
//!
//! Module map: `manager` (the API the scheduler calls: prefix matching, adoption with
//! copy-on-write, reservation, registration of full blocks, freeing), `block_pool` (reference
//! counts, free and cached blocks), `prefix` (content addressing of full blocks), `block_table`
//! (a sequence's blocks, a table per group of layers; window groups give back the blocks
//! behind their window), `layers` (what each layer keeps: every position, a window or a
//! recurrent state; the layers grouped by kind into table groups), `store` (the tensors), `quant`
//! (block-quantized rows), `states` (recurrent layers' per-sequence states), `snapshots` (states at shared prefixes), `attention` (attention through block tables: the backend seam;
//! `attention_x86` holds its AVX2 micro-kernels), `cache` (a single-sequence cache over a
//! private store), `sizing` (the pool's size from the `kvCache` options), `disk` (the prefix cache's disk tier:
//! full blocks in files under chained SHA-256 keys, written off the engine thread).
pub mod attention;
#[cfg(target_arch = "x86_64")]
mod attention_x86;
pub mod block_pool;
pub mod block_table;
pub mod cache;
pub mod disk;
pub mod image;
pub mod layers;
pub mod manager;
pub mod prefix;
pub mod quant;
pub mod sizing;
pub mod snapshots;
pub mod states;
pub mod store;
mod store_cpu;

pub use block_pool::BlockPool;
pub use block_table::BlockTable;
pub use cache::KvCache;
pub use layers::{KvLayout, LayerCache};
pub use manager::{KvManager, PinnedHit, PrefixHit};
pub use sizing::KvCacheOptions;
pub use store::{KvFormat, KvStore};

/// A physical block's index in the pool and the store.
pub type BlockId = u32;

/// `n` copies of `v`, or `OUT_OF_MEMORY` where the allocator refuses (per-block bookkeeping
/// is sized by the pool, which an address-space limit may not leave room for).
pub(crate) fn try_filled<T: Clone>(n: usize, v: T) -> crate::error::Result<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| {
        crate::error::EngineError::OutOfMemory(format!("cannot reserve the KV pool's bookkeeping for {n} blocks"))
    })?;
    out.resize(n, v);
    Ok(out)
}

/// A `[rows, cols]` f32 tensor of values uniform in `[-2, 2)` drawn from `seed`: tests of
/// numeric bounds get the same inputs on every run.
#[cfg(test)]
pub(crate) fn seeded(rows: usize, cols: usize, seed: u64) -> candle_core::Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let v: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-2.0f32..2.0)).collect();
    candle_core::Tensor::from_vec(v, (rows, cols), &candle_core::Device::Cpu).unwrap()
}
