//! A contiguous per-session KV cache: per layer, one `[kv_heads, capacity, head_dim]` buffer for
//! K and one for V. New positions are written in place; capacity grows geometrically (so a
//! decode step does not reallocate), bounded by the context length.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;

const MIN_CAPACITY: usize = 64;

pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    /// Committed positions (identical for every layer between forward passes).
    len: usize,
    capacity: usize,
    max_len: usize,
    kv_heads: usize,
    head_dim: usize,
    dtype: DType,
    device: Device,
}

impl KvCache {
    pub fn new(num_layers: usize, kv_heads: usize, head_dim: usize, max_len: usize, dtype: DType, device: &Device) -> Self {
        Self {
            layers: (0..num_layers).map(|_| None).collect(),
            len: 0,
            capacity: 0,
            max_len,
            kv_heads,
            head_dim,
            dtype,
            device: device.clone(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Forgets positions `len..`; the buffers are kept for reuse.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Drops the buffers as well.
    pub fn clear(&mut self) {
        self.len = 0;
        self.capacity = 0;
        self.layers.iter_mut().for_each(|l| *l = None);
    }

    /// Bytes held by the buffers.
    pub fn bytes(&self) -> usize {
        self.layers.iter().flatten().count() * 2 * self.kv_heads * self.capacity * self.head_dim * self.dtype.size_in_bytes()
    }

    /// Makes room for `new` more positions in every layer, before a forward pass.
    pub fn reserve(&mut self, new: usize) -> Result<()> {
        let need = self.len + new;
        if need <= self.capacity {
            return Ok(());
        }
        let cap = need.max(self.capacity * 2).max(MIN_CAPACITY).min(self.max_len.max(need));
        for slot in self.layers.iter_mut() {
            let shape = (self.kv_heads, cap, self.head_dim);
            let k = Tensor::zeros(shape, self.dtype, &self.device)?;
            let v = Tensor::zeros(shape, self.dtype, &self.device)?;
            if let Some((ok, ov)) = slot.as_ref().filter(|_| self.len > 0) {
                k.slice_set(&ok.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
                v.slice_set(&ov.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
            }
            *slot = Some((k, v));
        }
        self.capacity = cap;
        Ok(())
    }

    /// Writes `k`, `v` (`[kv_heads, new, head_dim]`) for `layer` at the committed length and
    /// returns views over all positions so far, `[kv_heads, len + new, head_dim]`.
    /// [`reserve`](Self::reserve) must have been called for `new` positions.
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let new = k.dim(1)?;
        let (kb, vb) = self.layers[layer].as_ref().expect("KvCache::reserve not called before append");
        kb.slice_set(&k.contiguous()?, 1, self.len)?;
        vb.slice_set(&v.contiguous()?, 1, self.len)?;
        Ok((kb.narrow(1, 0, self.len + new)?, vb.narrow(1, 0, self.len + new)?))
    }

    /// Makes `new` appended positions part of the cache, after every layer has appended.
    pub fn commit(&mut self, new: usize) {
        self.len += new;
    }
}
