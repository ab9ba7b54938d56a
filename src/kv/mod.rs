//! Key/value caches. They live outside the model: one pool of fixed-size blocks holds every
//! sequence's keys and values, and the decoder is handed each sequence's block table.
//!
//! Module map: `block_pool` (reference counts, free and cached blocks), `prefix` (content
//! addressing of full blocks), `block_table` (a sequence's blocks, copy-on-write), `store` (the
//! tensors), `attention` (attention through block tables: the backend seam), `cache` (a
//! single-sequence cache over a private store).
pub mod attention;
pub mod block_pool;
pub mod block_table;
pub mod cache;
pub mod prefix;
pub mod store;

pub use block_pool::{BlockId, BlockPool};
pub use block_table::BlockTable;
pub use cache::KvCache;
pub use store::KvStore;
