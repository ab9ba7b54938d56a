//! Key/value caches. They live outside the model: the decoder is handed a cache per call, so
//! each session owns its own and a later paged pool can replace this contiguous one.
pub mod attention;
pub mod cache;

pub use cache::KvCache;
