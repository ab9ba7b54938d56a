//! What each layer keeps per sequence, and the layers grouped by it.
//!
//! A full-attention layer keeps every position's key and value; a sliding-window layer needs
//! only its last `window` positions; a recurrent layer keeps a fixed-size state and no
//! positions at all. As in vLLM v1's hybrid KV-cache manager, layers of one kind form a group,
//! and each group is managed by the rules of its kind (a block table per sequence for
//! positions, a state slot per sequence for recurrent layers) while the memory they take is
//! sized together.
//!
//! Position layers are split into **table groups** of equal size `G` (the smallest kind's
//! layer count; a kind whose count `G` does not divide gets a last group with unused
//! slots). Every block of the shared pool holds `G` layers' keys and values, in `G` tensors,
//! and belongs to one group's table at a time: group `t`'s `j`-th layer reads and writes
//! tensor `j`. A sequence has one block table per group over the one pool, so a
//! sliding-window group gives the blocks behind its window back while the full-attention
//! group keeps them, and memory is never split between kinds in advance. A model whose layers
//! are all alike has one group of all its layers: one table, a tensor per layer. Recurrent
//! layers take no slot of a block: their states live in a slot of the state pool per sequence
//! ([`super::states`]).
//!
//! Layers may differ in their heads ([`HeadShape`]: Gemma 4's global layers have wider heads
//! than its sliding ones). Table groups then hold layers of one kind and one shape, and the
//! block tensors come in one set per shape (a **class**): every block has room in each class's
//! tensors, and a block holds its group's layers in its class's. On CPU a pool's memory is
//! committed only where it is written, so the room a block does not use costs nothing there.

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
    /// Nothing: the layer attends with an earlier layer's keys and values (KV sharing).
    Shared,
}

/// A layer's key/value heads: how many, and their dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeadShape {
    pub kv_heads: usize,
    pub head_dim: usize,
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
    /// Position layers in groups of equal size per shape, one block table each.
    pub tables: Vec<TableGroup>,
    /// Per layer: `(table group, block tensor)`; `None` for a layer that keeps no positions.
    layer_slots: Vec<Option<(usize, usize)>>,
    /// Per block tensor, the heads it holds (`None`: the pool's own shape).
    tensor_shapes: Vec<Option<HeadShape>>,
}

/// Position layers of one kind that share a block table; layer `layers[j]` uses slot `j` of
/// every block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableGroup {
    /// `None`: every position (full attention); `Some(w)`: the last `w` positions.
    pub window: Option<usize>,
    pub layers: Vec<usize>,
    /// Its layers' heads (`None`: the pool's own shape).
    pub shape: Option<HeadShape>,
}

impl KvLayout {
    /// Groups layers (`kinds[i]` is layer `i`'s) by kind, all of the pool's head shape.
    pub fn from_kinds(kinds: &[LayerCache]) -> Self {
        Self::from_shaped(kinds, &vec![None; kinds.len()])
    }

    /// Groups layers by kind and head shape (`shapes[i]` is layer `i`'s; `None`: the pool's).
    pub fn from_shaped(kinds: &[LayerCache], shapes: &[Option<HeadShape>]) -> Self {
        assert_eq!(kinds.len(), shapes.len(), "a shape per layer");
        let mut groups: Vec<KvGroup> = Vec::new();
        for (layer, &kind) in kinds.iter().enumerate() {
            match groups.iter_mut().find(|g| g.kind == kind) {
                Some(g) => g.layers.push(layer),
                None => groups.push(KvGroup { kind, layers: vec![layer] }),
            }
        }
        // Tables hold layers of one kind and one shape: a kind's layers split by shape.
        let mut runs: Vec<(Option<usize>, Option<HeadShape>, Vec<usize>)> = Vec::new();
        for g in &groups {
            let window = match g.kind {
                LayerCache::Full => None,
                LayerCache::Window { window } => Some(window),
                LayerCache::State { .. } | LayerCache::Shared => continue,
            };
            for &layer in &g.layers {
                match runs.iter_mut().find(|r| r.0 == window && r.1 == shapes[layer]) {
                    Some(r) => r.2.push(layer),
                    None => runs.push((window, shapes[layer], vec![layer])),
                }
            }
        }
        // Equal tables within a shape: the size of its smallest run.
        let mut classes: Vec<(Option<HeadShape>, usize)> = Vec::new();
        for r in &runs {
            match classes.iter_mut().find(|c| c.0 == r.1) {
                Some(c) => c.1 = c.1.min(r.2.len()),
                None => classes.push((r.1, r.2.len())),
            }
        }
        let class_start: Vec<usize> = classes.iter().scan(0, |at, c| Some(std::mem::replace(at, *at + c.1))).collect();
        let mut tables = Vec::new();
        let mut layer_slots = vec![None; kinds.len()];
        for (window, shape, layers) in runs {
            let class = classes.iter().position(|c| c.0 == shape).expect("a class per shape");
            for chunk in layers.chunks(classes[class].1) {
                for (slot, &layer) in chunk.iter().enumerate() {
                    layer_slots[layer] = Some((tables.len(), class_start[class] + slot));
                }
                tables.push(TableGroup { window, layers: chunk.to_vec(), shape });
            }
        }
        let tensor_shapes = classes.iter().flat_map(|&(shape, n)| std::iter::repeat_n(shape, n)).collect();
        KvLayout { groups, num_layers: kinds.len(), tables, layer_slots, tensor_shapes }
    }

    /// Block tensors of the pool: every class's layers per block.
    pub fn slots_per_block(&self) -> usize {
        self.tensor_shapes.len()
    }

    /// The heads each block tensor holds (`None`: the pool's own shape).
    pub fn tensor_shapes(&self) -> &[Option<HeadShape>] {
        &self.tensor_shapes
    }

    /// `(table group, block tensor)` of a layer that keeps positions.
    pub fn slot_of_layer(&self, layer: usize) -> Option<(usize, usize)> {
        self.layer_slots.get(layer).copied().flatten()
    }

    /// `n` full-attention layers.
    pub fn all_full(n: usize) -> Self {
        Self::from_kinds(&vec![LayerCache::Full; n])
    }

    /// Layers that keep keys and values by position (full and sliding-window attention).
    pub fn position_layers(&self) -> usize {
        self.groups
            .iter()
            .filter(|g| matches!(g.kind, LayerCache::Full | LayerCache::Window { .. }))
            .map(|g| g.layers.len())
            .sum()
    }

    /// Bytes one position takes over all the layers that keep positions, as if every layer
    /// were global: what the pool is sized by (a sequence holds at most that). `kv_heads` and
    /// `head_dim` are the pool's shape, for layers that have no shape of their own.
    pub fn bytes_per_token(&self, kv_heads: usize, head_dim: usize, format: impl Into<KvFormat>) -> usize {
        let format = format.into();
        self.tables
            .iter()
            .map(|t| {
                let s = t.shape.unwrap_or(HeadShape { kv_heads, head_dim });
                bytes_per_token(t.layers.len(), s.kv_heads, s.head_dim, format)
            })
            .sum()
    }

    /// Bytes of K and V of one position in one block: every block tensor's row, each class's
    /// room included (what a block of the pool reserves).
    pub fn block_bytes_per_position(&self, kv_heads: usize, head_dim: usize, format: impl Into<KvFormat>) -> usize {
        let format = format.into();
        self.tensor_shapes
            .iter()
            .map(|s| {
                let s = s.unwrap_or(HeadShape { kv_heads, head_dim });
                bytes_per_token(1, s.kv_heads, s.head_dim, format)
            })
            .sum()
    }

    /// Bytes one position takes in the pool: a block per table group, each block's row as
    /// [`Self::block_bytes_per_position`] reserves it (what the pool is sized by).
    pub fn pool_bytes_per_token(&self, kv_heads: usize, head_dim: usize, format: impl Into<KvFormat>) -> usize {
        self.tables.len().max(1).saturating_mul(self.block_bytes_per_position(kv_heads, head_dim, format))
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

    /// What the pool cannot manage, named; `None` when it manages every group. A model must
    /// keep positions in some layer: the pool's blocks are sized and handed out by them.
    pub fn unsupported(&self) -> Option<String> {
        (self.num_layers > 0 && self.position_layers() == 0)
            .then(|| "a model without attention layers (every layer recurrent)".to_string())
    }

    /// Whether some layer keeps a recurrent state.
    pub fn has_states(&self) -> bool {
        self.groups.iter().any(|g| matches!(g.kind, LayerCache::State { .. }))
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
        assert_eq!((l.unsupported(), l.has_states()), (None, true));
        let windows = KvLayout::from_kinds(&[w, LayerCache::Full, w]);
        assert_eq!((windows.unsupported(), windows.position_layers()), (None, 3));
    }

    #[test]
    fn position_layers_form_equal_table_groups_sharing_the_block_tensors() {
        // Gemma 3's pattern: five window layers, then a global one.
        let w = LayerCache::Window { window: 512 };
        let mut kinds = Vec::new();
        for _ in 0..3 {
            kinds.extend([w; 5]);
            kinds.push(LayerCache::Full);
        }
        let l = KvLayout::from_kinds(&kinds);
        assert_eq!(l.slots_per_block(), 3);
        let tables: Vec<_> = l.tables.iter().map(|t| (t.window, t.layers.clone())).collect();
        assert_eq!(
            tables,
            vec![
                (Some(512), vec![0, 1, 2]),
                (Some(512), vec![3, 4, 6]),
                (Some(512), vec![7, 8, 9]),
                (Some(512), vec![10, 12, 13]),
                (Some(512), vec![14, 15, 16]),
                (None, vec![5, 11, 17]),
            ]
        );
        assert_eq!((l.slot_of_layer(6), l.slot_of_layer(11), l.slot_of_layer(18)), (Some((1, 2)), Some((5, 1)), None));
        // A count the smallest kind does not divide leaves unused slots in the last group.
        let odd = KvLayout::from_kinds(&[w, w, w, LayerCache::Full, LayerCache::Full]);
        let sizes: Vec<_> = odd.tables.iter().map(|t| t.layers.len()).collect();
        assert_eq!((odd.slots_per_block(), sizes), (2, vec![2, 1, 2]));
        // One kind: one group of every layer, a tensor per layer (the layout before groups).
        let full = KvLayout::all_full(4);
        assert_eq!((full.tables.len(), full.slots_per_block(), full.slot_of_layer(3)), (1, 4, Some((0, 3))));
        // Recurrent layers take no slot.
        let s = LayerCache::State { bytes: 8 };
        let hybrid = KvLayout::from_kinds(&[s, s, LayerCache::Full]);
        assert_eq!((hybrid.tables.len(), hybrid.slot_of_layer(0), hybrid.slot_of_layer(2)), (1, None, Some((0, 0))));
    }

    /// Gemma 4: sliding layers of one head shape, global ones of a wider one. Tables hold one
    /// kind and one shape; each shape has its own block tensors.
    #[test]
    fn layers_of_other_head_shapes_get_their_own_tensors() {
        let w = LayerCache::Window { window: 512 };
        let (narrow, wide) = (HeadShape { kv_heads: 2, head_dim: 16 }, HeadShape { kv_heads: 1, head_dim: 64 });
        let kinds = [w, w, LayerCache::Full, w, w, LayerCache::Full];
        let shapes = [narrow, narrow, wide, narrow, narrow, wide].map(Some);
        let l = KvLayout::from_shaped(&kinds, &shapes);
        let tables: Vec<_> = l.tables.iter().map(|t| (t.window, t.layers.clone(), t.shape)).collect();
        assert_eq!(tables, vec![(Some(512), vec![0, 1, 3, 4], Some(narrow)), (None, vec![2, 5], Some(wide))]);
        assert_eq!(l.tensor_shapes(), &[Some(narrow), Some(narrow), Some(narrow), Some(narrow), Some(wide), Some(wide)]);
        assert_eq!((l.slot_of_layer(3), l.slot_of_layer(5)), (Some((0, 2)), Some((1, 5))));
        // Sized by each layer's own heads; a block reserves a row in every tensor.
        let f = DType::F32;
        assert_eq!(l.bytes_per_token(9, 9, f), bytes_per_token(4, 2, 16, f) + bytes_per_token(2, 1, 64, f));
        assert_eq!(l.block_bytes_per_position(9, 9, f), bytes_per_token(4, 2, 16, f) + bytes_per_token(2, 1, 64, f));
        // One kind in two shapes: two tables, two classes.
        let mixed = KvLayout::from_shaped(&[LayerCache::Full; 3], &[Some(narrow), Some(wide), Some(narrow)]);
        assert_eq!(mixed.tables.len(), 2);
        assert_eq!((mixed.slot_of_layer(1), mixed.slot_of_layer(2)), (Some((1, 2)), Some((0, 1))));
    }

    #[test]
    fn an_all_full_layout_is_one_group_sized_as_before() {
        let l = KvLayout::all_full(3);
        assert_eq!(l.groups, vec![KvGroup { kind: LayerCache::Full, layers: vec![0, 1, 2] }]);
        assert_eq!(l.tables, vec![TableGroup { window: None, layers: vec![0, 1, 2], shape: None }]);
        assert_eq!(l.bytes_per_token(4, 16, DType::BF16), bytes_per_token(3, 4, 16, DType::BF16));
        assert_eq!((l.state_bytes_per_sequence(), l.unsupported()), (0, None));
        let s = KvLayout::from_kinds(&[LayerCache::State { bytes: usize::MAX }, LayerCache::State { bytes: usize::MAX }]);
        assert_eq!(s.state_bytes_per_sequence(), usize::MAX, "saturates, never wraps");
        assert!(s.unsupported().unwrap().contains("without attention layers"));
    }
}
