//! The runtime's resident experts by name. Shared between the binding (load, unload, list,
//! resolving a request's names) and the engine thread; requests hold `Arc`s, so an unloaded
//! expert lives on exactly as long as a running request pins it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{Expert, ExpertSet};
use crate::error::{EngineError, Result};

#[derive(Default)]
pub struct Registry {
    by_name: Mutex<HashMap<String, Arc<Expert>>>,
    next_id: AtomicU64,
    /// Bumped by every insert and remove (under the map's lock).
    generation: AtomicU64,
}

impl Registry {
    /// A fresh load id.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Makes `expert` available under its name; a name can be loaded once at a time.
    pub fn insert(&self, expert: Arc<Expert>) -> Result<()> {
        let mut m = self.by_name.lock().unwrap();
        if m.contains_key(&expert.name) {
            return Err(EngineError::InvalidArgument(format!(
                "an expert named '{}' is already loaded; unload it first or pass another name",
                expert.name
            )));
        }
        m.insert(expert.name.clone(), expert);
        self.generation.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Removes the expert with this name and load id; `false` when it is not (or no longer)
    /// loaded.
    pub fn remove(&self, name: &str, id: u64) -> bool {
        let removed = {
            let mut m = self.by_name.lock().unwrap();
            if m.get(name).is_none_or(|e| e.id != id) {
                return false;
            }
            self.generation.fetch_add(1, Ordering::Relaxed);
            m.remove(name)
        };
        // The last reference frees the weights on the thread pool, not on the caller's (the
        // JS) thread: unmapping a read-in-place adapter whose pages requests touched costs
        // about 1.5 ms per 40 MB, freeing a copied one about 0.5 ms.
        if let Some(e) = removed.filter(|e| Arc::strong_count(e) == 1) {
            rayon::spawn(move || drop(e));
        }
        true
    }

    pub fn get(&self, name: &str) -> Option<Arc<Expert>> {
        self.by_name.lock().unwrap().get(name).cloned()
    }

    /// Every loaded expert, in load order.
    pub fn list(&self) -> Vec<Arc<Expert>> {
        self.snapshot().1
    }

    /// [`Self::list`] with the generation it belongs to: equal generations, equal lists.
    pub fn snapshot(&self) -> (u64, Vec<Arc<Expert>>) {
        self.with_loaded(|generation, experts| (generation, experts.to_vec()))
    }

    /// Runs `f` over the loaded experts (in load order, with their generation) while none can
    /// be loaded or unloaded: an expert `f` picks is still loaded when it returns. `f` must be
    /// quick (loads and unloads wait for it) and must not call back into the registry.
    pub fn with_loaded<T>(&self, f: impl FnOnce(u64, &[Arc<Expert>]) -> T) -> T {
        let m = self.by_name.lock().unwrap();
        let mut v: Vec<Arc<Expert>> = m.values().cloned().collect();
        v.sort_by_key(|e| e.id);
        f(self.generation.load(Ordering::Relaxed), &v)
    }

    /// The set a request runs under: `EXPERT_NOT_FOUND` for a name not loaded,
    /// `INVALID_ARGUMENT` for a name listed twice.
    pub fn resolve(&self, names: &[String]) -> Result<ExpertSet> {
        let m = self.by_name.lock().unwrap();
        let mut experts = Vec::with_capacity(names.len());
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return Err(EngineError::InvalidArgument(format!("expert '{n}' is listed twice")));
            }
            let e = m.get(n).ok_or_else(|| {
                let mut loaded: Vec<&str> = m.keys().map(String::as_str).collect();
                loaded.sort_unstable();
                EngineError::ExpertNotFound(format!("no expert named '{n}' is loaded (loaded: {loaded:?})"))
            })?;
            experts.push(e.clone());
        }
        Ok(ExpertSet::new(experts))
    }
}
