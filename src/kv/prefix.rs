//! Prefix index: full KV blocks addressed by their content.
//!
//! A block's key is `(parent content id, expert-set key, the block's token ids)`. The parent is
//! the *content id* of the block before it in the sequence (0 for the first block), so a key
//! names the whole prefix up to and including the block without storing it. Content ids are
//! handed out once and never reused: when a block is recycled, keys that named it as a parent
//! can no longer be reached, because a lookup walks from the first block and only ever asks for
//! children of a block it just found.
//!
//! The map is keyed by a 64-bit hash of the key; every hit is confirmed by comparing the stored
//! key, so two keys that hash alike (tests inject a constant hasher) never share a block.
//! The expert set is part of the key: blocks computed under different adapters never mix.
//!
//! A block forgotten (recycled, given back, about to be overwritten) leaves a *link*: its key
//! and content id, without the block. A lookup walks through links, so a chain stays reachable
//! past blocks that are gone: a sliding-window layer's blocks behind the window are never read
//! again, only named as parents, and are the first a busy pool recycles. A block registered
//! again under a link's key takes the link's content id back, which reconnects the chain's
//! later blocks. Links are bounded (oldest forgotten first). So a content id names contents,
//! not a block: blocks that hold the same id (a link's id given back, a window group's copy of
//! a hit registered as its source, [`PrefixIndex::insert_copy`]) hold the same keys and values.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use super::BlockId;

/// The content id standing for "no block before": the start of a sequence (in the first
/// table group; see [`root`]).
pub const ROOT: u64 = 0;

/// Content ids below this stand for the start of a sequence in table group `id`, so that the
/// groups' chains of keys never meet (each group's blocks hold other layers).
const FIRST_CID: u64 = 1 << 32;

/// The start of a sequence in table group `group`.
pub fn root(group: usize) -> u64 {
    debug_assert!((group as u64) < FIRST_CID);
    group as u64
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockKey {
    pub parent: u64,
    pub experts: Vec<u64>,
    pub tokens: Vec<u32>,
}

pub type KeyHasher = fn(&BlockKey) -> u64;

pub(super) fn sip_hash(k: &BlockKey) -> u64 {
    let mut h = DefaultHasher::new();
    k.hash(&mut h);
    h.finish()
}

#[derive(Clone)]
struct Entry {
    hash: u64,
    key: BlockKey,
    cid: u64,
    /// A copy of another block's contents under its content id (see [`PrefixIndex::insert_copy`]).
    copy: bool,
}

/// A forgotten block's key and content id (see the module note).
struct Link {
    key: BlockKey,
    cid: u64,
    /// Its place in [`PrefixIndex::link_order`].
    seq: u64,
}

/// Links kept at most per block of the pool (a link is its key and the maps' entries: ~200
/// bytes for 16 tokens).
const LINKS_PER_BLOCK: usize = 2;

/// What the index did, for subscribers of KV events (recorded only while
/// [`PrefixIndex::record_events`] is on): a block registered under a key, or forgotten.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexEvent {
    /// `parent`: the content id of the block before it (`None` at a sequence's start).
    Stored {
        cid: u64,
        parent: Option<u64>,
        experts: Vec<u64>,
        tokens: Vec<u32>,
    },
    Removed {
        cid: u64,
    },
}

pub struct PrefixIndex {
    /// Recorded events, while on.
    events: Option<Vec<IndexEvent>>,
    hasher: KeyHasher,
    by_hash: HashMap<u64, Vec<BlockId>>,
    /// Indexed by block id.
    entries: Vec<Option<Entry>>,
    /// Registered blocks by their parent's content id (for partial matches).
    children: HashMap<u64, Vec<BlockId>>,
    next_cid: u64,
    /// Links by their key's hash.
    links: HashMap<u64, Vec<Link>>,
    /// Links oldest first: sequence number → key hash.
    link_order: BTreeMap<u64, u64>,
    next_link: u64,
    max_links: usize,
}

impl PrefixIndex {
    pub fn new(num_blocks: usize) -> Self {
        Self::with_hasher(num_blocks, sip_hash)
    }

    pub fn with_hasher(num_blocks: usize, hasher: KeyHasher) -> Self {
        Self::try_with_hasher(num_blocks, hasher).expect("prefix index bookkeeping")
    }

    /// [`Self::with_hasher`], or `OUT_OF_MEMORY` where the entries cannot be reserved.
    pub fn try_with_hasher(num_blocks: usize, hasher: KeyHasher) -> crate::error::Result<Self> {
        let entries = super::try_filled(num_blocks, None)?;
        Ok(Self {
            events: None,
            hasher,
            by_hash: HashMap::new(),
            entries,
            children: HashMap::new(),
            next_cid: FIRST_CID,
            links: HashMap::new(),
            link_order: BTreeMap::new(),
            next_link: 0,
            max_links: num_blocks.saturating_mul(LINKS_PER_BLOCK).max(64),
        })
    }

    /// Records [`IndexEvent`]s from now on (`true`), or stops and forgets them.
    pub fn record_events(&mut self, on: bool) {
        match (on, &self.events) {
            (true, None) => self.events = Some(Vec::new()),
            (false, _) => self.events = None,
            _ => {}
        }
    }

    /// The events recorded since the last call.
    pub fn take_events(&mut self) -> Vec<IndexEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub fn is_registered(&self, b: BlockId) -> bool {
        self.entries[b as usize].is_some()
    }

    /// The content id of a registered block.
    pub fn cid(&self, b: BlockId) -> Option<u64> {
        self.entries[b as usize].as_ref().map(|e| e.cid)
    }

    /// The key `b` is registered under.
    pub fn key(&self, b: BlockId) -> Option<&BlockKey> {
        self.entries[b as usize].as_ref().map(|e| &e.key)
    }

    /// Registers `b` under `key` and returns its content id: a link's under an equal key (which
    /// it replaces), else a new one. `b` must not be registered. A second block with an equal
    /// key is allowed (both stay valid); lookups return either.
    pub fn insert(&mut self, b: BlockId, key: BlockKey) -> u64 {
        debug_assert!(!self.is_registered(b), "block {b} registered twice");
        let hash = (self.hasher)(&key);
        let cid = match self.take_link(hash, &key) {
            Some(cid) => cid,
            None => {
                self.next_cid += 1;
                self.next_cid - 1
            }
        };
        self.by_hash.entry(hash).or_default().push(b);
        self.children.entry(key.parent).or_default().push(b);
        if let Some(events) = &mut self.events {
            let parent = (key.parent >= FIRST_CID).then_some(key.parent);
            events.push(IndexEvent::Stored { cid, parent, experts: key.experts.clone(), tokens: key.tokens.clone() });
        }
        self.entries[b as usize] = Some(Entry { hash, key, cid, copy: false });
        cid
    }

    /// Registers `b`, which holds a copy of registered block `of`'s contents (a window group's
    /// private copy of a prefix hit), under `of`'s key and content id, so that the blocks it
    /// names as their parent chain from the same id a lookup reaches. A copy leaves no link and
    /// records no event: the block it copies stands for its contents.
    pub fn insert_copy(&mut self, b: BlockId, of: BlockId) {
        debug_assert!(!self.is_registered(b), "block {b} registered twice");
        let Some(e) = self.entries[of as usize].clone() else { return };
        self.by_hash.entry(e.hash).or_default().push(b);
        self.children.entry(e.key.parent).or_default().push(b);
        self.entries[b as usize] = Some(Entry { copy: true, ..e });
    }

    /// Forgets `b` (its contents are about to change), leaving a link. No-op when it is not
    /// registered.
    pub fn remove(&mut self, b: BlockId) {
        let Some(e) = self.entries[b as usize].take() else { return };
        remove_from(&mut self.by_hash, e.hash, b);
        remove_from(&mut self.children, e.key.parent, b);
        if e.copy {
            return;
        }
        if let Some(events) = &mut self.events {
            events.push(IndexEvent::Removed { cid: e.cid });
        }
        let seq = self.next_link;
        self.next_link += 1;
        self.link_order.insert(seq, e.hash);
        self.links.entry(e.hash).or_default().push(Link { key: e.key, cid: e.cid, seq });
        if self.link_order.len() > self.max_links {
            let (old, hash) = self.link_order.pop_first().expect("over the bound");
            let v = self.links.get_mut(&hash).expect("every ordered link is listed");
            v.retain(|l| l.seq != old);
            if v.is_empty() {
                self.links.remove(&hash);
            }
        }
    }

    /// Removes the link under a key equal to `key` (of hash `hash`), returning its content id.
    fn take_link(&mut self, hash: u64, key: &BlockKey) -> Option<u64> {
        let v = self.links.get_mut(&hash)?;
        let i = v.iter().position(|l| l.key == *key)?;
        let link = v.swap_remove(i);
        if v.is_empty() {
            self.links.remove(&hash);
        }
        self.link_order.remove(&link.seq);
        Some(link.cid)
    }

    /// Links kept (forgotten blocks whose keys still name their chains).
    pub fn links(&self) -> usize {
        self.link_order.len()
    }

    /// A registered block whose key equals `key` (contents compared, not just hashes).
    pub fn lookup(&self, key: &BlockKey) -> Option<BlockId> {
        self.find((self.hasher)(key), key).map(|(b, _)| b)
    }

    fn find(&self, hash: u64, key: &BlockKey) -> Option<(BlockId, u64)> {
        self.by_hash.get(&hash)?.iter().find_map(|&b| {
            let e = self.entries[b as usize].as_ref()?;
            (e.key == *key).then_some((b, e.cid))
        })
    }

    /// What a chain walk finds under `key`: a registered block and its content id, or only the
    /// content id a link keeps (the block is gone).
    pub fn lookup_link(&self, key: &BlockKey) -> Option<(Option<BlockId>, u64)> {
        let hash = (self.hasher)(key);
        if let Some((b, cid)) = self.find(hash, key) {
            return Some((Some(b), cid));
        }
        self.links.get(&hash)?.iter().find(|l| l.key == *key).map(|l| (None, l.cid))
    }

    /// Among registered children of `parent` under `experts`, the one sharing the longest
    /// token prefix with `tokens` (at least one token): `(block, shared tokens)`.
    pub fn longest_partial(&self, parent: u64, experts: &[u64], tokens: &[u32]) -> Option<(BlockId, usize)> {
        let kids = self.children.get(&parent)?;
        kids.iter()
            .filter_map(|&b| {
                let e = self.entries[b as usize].as_ref()?;
                if e.key.experts != experts {
                    return None;
                }
                let n = e.key.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count();
                (n > 0).then_some((b, n))
            })
            .max_by_key(|&(b, n)| (n, std::cmp::Reverse(b)))
    }
}

fn remove_from(map: &mut HashMap<u64, Vec<BlockId>>, key: u64, b: BlockId) {
    if let Some(v) = map.get_mut(&key) {
        v.retain(|&x| x != b);
        if v.is_empty() {
            map.remove(&key);
        }
    }
}
