//! A sequence's cache as plain bytes and back: what a saved session keeps of the KV cache.
//!
//! Design note
//! -----------
//! * A block's image is, for every tensor of the pool in a fixed order (K, V, then the scales
//!   of a quantized pool; each block slot's layer in turn), the block's `block_size` rows
//!   position-major (`[block_size, kv_heads · width]`), little-endian, in the pool's own dtype:
//!   quantized values stay quantized, so a restored block is the saved one bit for bit, and
//!   the image does not depend on whether the pool is head-major (CPU) or position-major.
//! * [`KvManager::export_table`] takes the blocks a table's positions fill and its recurrent
//!   state (f32, with the position it stands at); [`KvManager::import_table`] allocates a fresh
//!   table for them, writes them and sets the state, or says there is no room. Every size is
//!   checked against the pool before anything is written.
//! * Only models whose attention layers keep every position in one table group can be
//!   imaged; a sliding window's given-back blocks have no image, and such a model is refused
//!   with the reason.

use candle_core::{DType, Tensor};

use super::block_table::{blocks_for, BlockTable};
use super::manager::KvManager;
use super::store::{KvStore, SlotRun};
use super::BlockId;
use crate::error::{EngineError, Result};

/// A table's contents (see the module note).
#[derive(Clone, Debug, PartialEq)]
pub struct TableImage {
    /// Positions written.
    pub len: usize,
    /// The image of each block the positions fill, in position order.
    pub blocks: Vec<Vec<u8>>,
    /// The recurrent states (every recurrent layer's region), standing at `len`.
    pub state: Option<Vec<f32>>,
}

fn le_bytes(t: &Tensor, out: &mut Vec<u8>) -> Result<()> {
    let t = t.flatten_all()?;
    match t.dtype() {
        DType::F32 => t.to_vec1::<f32>()?.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        DType::F16 => t.to_vec1::<half::f16>()?.iter().for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes())),
        DType::BF16 => t.to_vec1::<half::bf16>()?.iter().for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes())),
        DType::U8 => out.extend_from_slice(&t.to_vec1::<u8>()?),
        d => return Err(EngineError::Internal(format!("a KV pool of {d:?} has no image"))),
    }
    Ok(())
}

fn from_le_bytes(bytes: &[u8], dtype: DType, shape: (usize, usize), device: &candle_core::Device) -> Result<Tensor> {
    let u16s = || bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
    let t = match dtype {
        DType::F32 => {
            let v: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            Tensor::from_vec(v, shape, device)?
        }
        DType::F16 => Tensor::from_vec(u16s().map(half::f16::from_bits).collect::<Vec<_>>(), shape, device)?,
        DType::BF16 => Tensor::from_vec(u16s().map(half::bf16::from_bits).collect::<Vec<_>>(), shape, device)?,
        DType::U8 => Tensor::from_vec(bytes.to_vec(), shape, device)?,
        d => return Err(EngineError::Internal(format!("a KV pool of {d:?} has no image"))),
    };
    Ok(t)
}

impl KvStore {
    /// The image of block `b` (see the module note); [`Self::bytes_per_block`] bytes.
    pub fn block_image(&self, b: BlockId) -> Result<Vec<u8>> {
        let (bs, slots) = (self.block_size, self.slots());
        let start = (b as usize).checked_mul(bs).filter(|s| s + bs <= slots).ok_or_else(|| no_block(b))?;
        let mut out = Vec::with_capacity(self.bytes_per_block());
        for (t, heads) in self.tensors_with_heads() {
            let rows = if self.head_major() {
                let width = t.dim(1)?;
                t.reshape((heads, slots, width))?.narrow(1, start, bs)?.transpose(0, 1)?.contiguous()?
            } else {
                t.narrow(0, start, bs)?
            };
            le_bytes(&rows, &mut out)?;
        }
        Ok(out)
    }

    /// Writes an image made by [`Self::block_image`] of a pool of the same shape into block
    /// `b`. Fails, writing nothing, when its size is not the pool's.
    pub fn set_block_image(&self, b: BlockId, image: &[u8]) -> Result<()> {
        let (bs, slots) = (self.block_size, self.slots());
        let start = (b as usize).checked_mul(bs).filter(|s| s + bs <= slots).ok_or_else(|| no_block(b))?;
        let parts: Vec<(&Tensor, usize, usize, usize)> = self
            .tensors_with_heads()
            .map(|(t, heads)| {
                let cols = if self.head_major() { t.dim(1)? * heads } else { t.dim(1)? };
                Ok((t, heads, cols, bs * cols * t.dtype().size_in_bytes()))
            })
            .collect::<Result<_>>()?;
        let total: usize = parts.iter().map(|p| p.3).sum();
        if image.len() != total {
            return Err(EngineError::InvalidArgument(format!(
                "a KV block image of {} bytes does not fit this pool's blocks of {total} bytes",
                image.len()
            )));
        }
        let mut at = 0;
        for (t, heads, cols, n) in parts {
            let src = from_le_bytes(&image[at..at + n], t.dtype(), (bs, cols), t.device())?;
            at += n;
            if self.head_major() {
                let runs = [SlotRun { row: 0, slot: start, len: bs }];
                let op = super::store_cpu::WriteRuns { runs: &runs, heads, width: cols / heads, slots };
                t.inplace_op2(&src, &op)?;
            } else {
                t.slice_set(&src, 0, start)?;
            }
        }
        Ok(())
    }
}

fn no_block(b: BlockId) -> EngineError {
    EngineError::Internal(format!("KV block {b} is outside the pool"))
}

impl KvManager {
    /// Whether a table of this model can be imaged (see the module note): `Err` with the reason.
    pub fn check_imageable(&self) -> Result<()> {
        let rules = self.rules();
        if rules.len() > 1 || rules.iter().any(|r| r.window.is_some()) {
            return Err(EngineError::InvalidArgument(
                "this model's attention layers do not all keep every position (a sliding window, or layers of \
                 several shapes), and saving its sessions is not supported yet"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The contents of `table`'s written positions.
    pub fn export_table(&self, table: &BlockTable) -> Result<TableImage> {
        self.check_imageable()?;
        let n = blocks_for(table.len(), self.block_size());
        let listed = table.blocks();
        if listed.len() < n {
            return Err(EngineError::Internal(format!("a table of {} positions lists {} blocks", table.len(), listed.len())));
        }
        let blocks = listed[..n].iter().map(|&b| self.store().block_image(b)).collect::<Result<_>>()?;
        let state = match table.state() {
            Some(slot) => Some(self.store().states().export(slot, table.len())?),
            None => None,
        };
        Ok(TableImage { len: table.len(), blocks, state })
    }

    /// A new table holding `image`; `Ok(None)` when the pool has no room for it now. Fails,
    /// allocating nothing, when the image does not fit this pool.
    pub fn import_table(&mut self, image: &TableImage) -> Result<Option<BlockTable>> {
        self.check_imageable()?;
        let n = blocks_for(image.len, self.block_size());
        let bytes = self.store().bytes_per_block();
        if image.blocks.len() != n || image.blocks.iter().any(|b| b.len() != bytes) {
            return Err(EngineError::InvalidArgument(format!(
                "the saved cache holds {} blocks for {} positions; this pool needs {n} of {bytes} bytes",
                image.blocks.len(),
                image.len
            )));
        }
        let floats = self.store().states().bytes_per_slot() / 4;
        match (&image.state, self.has_states()) {
            (Some(s), true) if s.len() == floats => {}
            (None, false) => {}
            _ => {
                return Err(EngineError::InvalidArgument(format!(
                    "the saved recurrent state ({} values) does not fit this model's ({floats})",
                    image.state.as_ref().map_or(0, Vec::len)
                )))
            }
        }
        if image.len > self.total_positions() {
            return Err(EngineError::KvCacheExhausted(format!(
                "the saved cache holds {} positions; the pool has {}",
                image.len,
                self.total_positions()
            )));
        }
        let mut table = BlockTable::default();
        if !self.resume(&mut table, 0, n)? {
            return Ok(None);
        }
        let written = (|| -> Result<()> {
            for (&b, img) in table.blocks().iter().zip(&image.blocks) {
                self.store().set_block_image(b, img)?;
            }
            if let (Some(slot), Some(s)) = (table.state(), &image.state) {
                self.store().states().import(slot, s, image.len)?;
            }
            Ok(())
        })();
        if let Err(e) = written {
            self.free(&mut table);
            return Err(e);
        }
        table.advance(image.len);
        self.shrink(&mut table);
        Ok(Some(table))
    }
}

#[cfg(test)]
#[path = "image_tests.rs"]
mod tests;
