//! What each layer keeps per sequence, and the layers grouped by it.
//!
//! A full-attention layer keeps every position's key and value; a sliding-window layer needs
//! only its last `window` positions; a recurrent layer keeps a fixed-size state and no
//! positions at all. As in vLLM v1's hybrid KV-cache manager, layers of one kind form a group,
//! and each group is managed by the rules of its kind (a block table per sequence for
//! positions, a state slot per sequence for recurrent layers) while the memory they take is
//! sized together. [`KvManager`](super::KvManager) manages position layers (full and
//! sliding-window) through one block table per sequence; a sliding-window layer keeps every
//! position for now, like a full layer (its attention reads only the window, so giving the
//! blocks behind it back to the pool needs a block table of its own). A recurrent state is
//! refused by name ([`KvLayout::unsupported`]) until its manager exists.

use super::store::{bytes_per_token, KvFormat};

/// What one layer keeps per sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerCache {
    /// Every position's key and value.
    Full,
    /// The last `window` positions' keys and values.
    Window { window: usize },
    /// A fixed-size recurrent state of `bytes` bytes, no positions.
    State { bytes: usize },
}

/// Layers of one kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvGroup {
    pub kind: LayerCache,
    /// The model's layer indices, ascending.
    pub layers: Vec<usize>,
}

/// A model's layers grouped by what they keep, in order of each kind's first layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub groups: Vec<KvGroup>,
    pub num_layers: usize,
}

impl KvLayout {
    /// Groups layers (`kinds[i]` is layer `i`'s) by kind.
    pub fn from_kinds(kinds: &[LayerCache]) -> Self {
        let mut groups: Vec<KvGroup> = Vec::new();
        for (layer, &kind) in kinds.iter().enumerate() {
            match groups.iter_mut().find(|g| g.kind == kind) {
                Some(g) => g.layers.push(layer),
                None => groups.push(KvGroup { kind, layers: vec![layer] }),
            }
        }
        KvLayout { groups, num_layers: kinds.len() }
    }

    /// `n` full-attention layers.
    pub fn all_full(n: usize) -> Self {
        Self::from_kinds(&vec![LayerCache::Full; n])
    }

    /// Layers that keep keys and values by position (full and sliding-window attention).
    pub fn position_layers(&self) -> usize {
        self.groups.iter().filter(|g| !matches!(g.kind, LayerCache::State { .. })).map(|g| g.layers.len()).sum()
    }

    /// Bytes one position takes over all the layers that keep positions: what the pool is
    /// sized by.
    pub fn bytes_per_token(&self, kv_heads: usize, head_dim: usize, format: impl Into<KvFormat>) -> usize {
        bytes_per_token(self.position_layers(), kv_heads, head_dim, format)
    }

    /// Bytes of recurrent state one sequence takes over all recurrent layers.
    pub fn state_bytes_per_sequence(&self) -> usize {
        self.groups
            .iter()
            .map(|g| match g.kind {
                LayerCache::State { bytes } => bytes.saturating_mul(g.layers.len()),
                _ => 0,
            })
            .fold(0, usize::saturating_add)
    }

    /// The first group that the pool cannot manage yet, named; `None` when it manages them all.
    pub fn unsupported(&self) -> Option<String> {
        self.groups.iter().find_map(|g| match g.kind {
            // A window layer keeps every position, as a full one (see the module's note).
            LayerCache::Full | LayerCache::Window { .. } => None,
            LayerCache::State { bytes } => {
                Some(format!("a recurrent state in the KV cache ({bytes} bytes a sequence, layers {:?})", g.layers))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;

    #[test]
    fn groups_layers_by_kind_in_order_of_first_appearance() {
        let w = LayerCache::Window { window: 512 };
        let s = LayerCache::State { bytes: 1000 };
        let l = KvLayout::from_kinds(&[w, w, LayerCache::Full, s, w, LayerCache::Full, s]);
        let kinds: Vec<_> = l.groups.iter().map(|g| (g.kind, g.layers.clone())).collect();
        assert_eq!(kinds, vec![(w, vec![0, 1, 4]), (LayerCache::Full, vec![2, 5]), (s, vec![3, 6])]);
        assert_eq!((l.num_layers, l.position_layers(), l.state_bytes_per_sequence()), (7, 5, 2000));
        // Positions are sized by the layers that keep them; a state never counts per token.
        assert_eq!(l.bytes_per_token(2, 8, DType::F32), bytes_per_token(5, 2, 8, DType::F32));
        assert!(l.unsupported().unwrap().contains("recurrent state in the KV cache (1000 bytes a sequence, layers [3, 6])"));
        let windows = KvLayout::from_kinds(&[w, LayerCache::Full, w]);
        assert_eq!((windows.unsupported(), windows.position_layers()), (None, 3));
    }

    #[test]
    fn an_all_full_layout_is_one_group_sized_as_before() {
        let l = KvLayout::all_full(3);
        assert_eq!(l.groups, vec![KvGroup { kind: LayerCache::Full, layers: vec![0, 1, 2] }]);
        assert_eq!(l.bytes_per_token(4, 16, DType::BF16), bytes_per_token(3, 4, 16, DType::BF16));
        assert_eq!((l.state_bytes_per_sequence(), l.unsupported()), (0, None));
        let s = KvLayout::from_kinds(&[LayerCache::State { bytes: usize::MAX }, LayerCache::State { bytes: usize::MAX }]);
        assert_eq!(s.state_bytes_per_sequence(), usize::MAX, "saturates, never wraps");
        assert!(s.unsupported().unwrap().contains("recurrent state"));
    }
}
