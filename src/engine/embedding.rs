//! Embedding requests on the engine thread: each text is a job whose prompt is evaluated in
//! chunks, as rows of the same batched passes that decode the sessions (so an embedding never
//! stalls a running decode), and whose final hidden states are pooled as the chunks come
//! back. A job holds KV blocks only while it runs (every row's hidden state is needed, so a
//! cached prefix would not save work) and frees them when its last chunk is evaluated.
//!
//! The scheduler owns the blocks and the pass; this module holds the jobs, the pooling and the
//! bookkeeping of which request each vector belongs to.

use std::collections::{HashMap, VecDeque};

use super::request::{EmbedReply, EmbedRequest, Pooling};
use crate::error::{EngineError, Result};
use crate::experts::ExpertSet;
use crate::kv::BlockTable;

/// One text of an embedding request.
pub struct TextJob {
    pub request: u64,
    index: usize,
    pub tokens: Vec<u32>,
    /// Prompt-tuning virtual tokens evaluated before the text (not pooled).
    pub n_virtual: usize,
    pub experts: ExpertSet,
    pub table: BlockTable,
    pooling: Pooling,
    /// Mean pooling: the running sum of the rows seen (f64, so a long text's sum stays exact
    /// to f32 precision).
    sum: Vec<f64>,
    /// Last pooling: the latest row seen.
    last: Vec<f32>,
}

impl TextJob {
    /// Positions the job fills: its virtual tokens, then the text.
    pub fn target(&self) -> usize {
        self.n_virtual + self.tokens.len()
    }

    pub fn is_done(&self) -> bool {
        self.table.len() == self.target()
    }

    /// Folds in the hidden states of a chunk's token rows.
    pub fn absorb(&mut self, rows: &[Vec<f32>]) {
        match self.pooling {
            Pooling::Mean => {
                for r in rows {
                    if self.sum.is_empty() {
                        self.sum = vec![0.0; r.len()];
                    }
                    self.sum.iter_mut().zip(r).for_each(|(s, &x)| *s += x as f64);
                }
            }
            Pooling::Last => {
                if let Some(r) = rows.last() {
                    self.last.clone_from(r);
                }
            }
        }
    }

    fn vector(&self) -> Vec<f32> {
        match self.pooling {
            Pooling::Mean => {
                let n = self.tokens.len() as f64;
                self.sum.iter().map(|&s| (s / n) as f32).collect()
            }
            Pooling::Last => self.last.clone(),
        }
    }
}

struct Pending {
    vectors: Vec<Option<Vec<f32>>>,
    left: usize,
    reply: EmbedReply,
}

/// The embedding jobs: waiting for blocks (arrival order) and running, with the requests they
/// answer.
#[derive(Default)]
pub struct Embeddings {
    pub waiting: VecDeque<TextJob>,
    pub running: Vec<TextJob>,
    requests: HashMap<u64, Pending>,
    next: u64,
}

impl Embeddings {
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Checks every text against the context (`limit`: what one sequence may fill) and queues
    /// its jobs; an error is returned (not replied) and nothing is queued.
    pub fn submit(
        &mut self,
        req: EmbedRequest,
        context_length: usize,
        pool_positions: usize,
    ) -> Result<(), (EngineError, EmbedReply)> {
        let EmbedRequest { texts, pooling, experts, reply } = req;
        let n_virtual = experts.num_virtual_tokens();
        for (i, t) in texts.iter().enumerate() {
            let err = if t.is_empty() {
                Some(EngineError::InvalidArgument(format!("text {i} is empty (it has no tokens)")))
            } else if n_virtual + t.len() > context_length {
                Some(EngineError::ContextOverflow(format!(
                    "text {i} has {} tokens but the context length is {context_length}",
                    t.len()
                )))
            } else if n_virtual + t.len() > pool_positions {
                Some(EngineError::KvCacheExhausted(format!(
                    "text {i} has {} tokens but the KV cache holds {pool_positions} in all (kvCache.maxTokens)",
                    t.len()
                )))
            } else {
                None
            };
            if let Some(e) = err {
                return Err((e, reply));
            }
        }
        if texts.is_empty() {
            reply(Ok(Vec::new()));
            return Ok(());
        }
        self.next += 1;
        let id = self.next;
        self.requests.insert(id, Pending { vectors: vec![None; texts.len()], left: texts.len(), reply });
        for (index, tokens) in texts.into_iter().enumerate() {
            self.waiting.push_back(TextJob {
                request: id,
                index,
                tokens,
                n_virtual,
                experts: experts.clone(),
                table: BlockTable::default(),
                pooling,
                sum: Vec::new(),
                last: Vec::new(),
            });
        }
        Ok(())
    }

    /// Records a finished job's vector (its blocks already freed); replies when it was the
    /// request's last.
    pub fn complete(&mut self, job: TextJob) {
        let Some(p) = self.requests.get_mut(&job.request) else { return };
        p.vectors[job.index] = Some(job.vector());
        p.left -= 1;
        if p.left == 0 {
            let p = self.requests.remove(&job.request).expect("present");
            let vectors = p.vectors.into_iter().map(|v| v.expect("every job completed")).collect();
            call(p.reply, Ok(vectors));
        }
    }

    /// Fails `request`: replies with `e` and returns its jobs (waiting or running) so the
    /// caller frees their blocks.
    pub fn fail(&mut self, request: u64, e: EngineError) -> Vec<TextJob> {
        if let Some(p) = self.requests.remove(&request) {
            call(p.reply, Err(e));
        }
        let mut out: Vec<TextJob> = Vec::new();
        let (keep, gone): (Vec<TextJob>, Vec<TextJob>) = self.running.drain(..).partition(|j| j.request != request);
        self.running = keep;
        out.extend(gone);
        let (keep, gone): (VecDeque<TextJob>, VecDeque<TextJob>) = self.waiting.drain(..).partition(|j| j.request != request);
        self.waiting = keep;
        out.extend(gone);
        out
    }

    /// The requests with a job in `jobs`.
    pub fn requests_of<'a>(jobs: impl IntoIterator<Item = &'a TextJob>) -> Vec<u64> {
        let mut ids: Vec<u64> = jobs.into_iter().map(|j| j.request).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Fails every request (shutdown).
    pub fn fail_all(&mut self, e: EngineError) {
        self.waiting.clear();
        self.running.clear();
        for (_, p) in self.requests.drain() {
            call(p.reply, Err(e.clone()));
        }
    }
}

/// Runs a reply; a panic in it must not unwind through the engine loop.
pub fn call(reply: EmbedReply, r: Result<Vec<Vec<f32>>>) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || reply(r)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    type Slot = Arc<Mutex<Option<Result<Vec<Vec<f32>>>>>>;

    fn capture() -> (EmbedReply, Slot) {
        let slot = Arc::new(Mutex::new(None));
        let s = slot.clone();
        (Box::new(move |r| *s.lock().unwrap() = Some(r)), slot)
    }

    #[test]
    fn pools_mean_and_last_over_chunks() {
        let mut e = Embeddings::default();
        let (reply, out) = capture();
        let req = EmbedRequest { texts: vec![vec![1, 2, 3], vec![4]], pooling: Pooling::Mean, experts: ExpertSet::none(), reply };
        assert!(e.submit(req, 16, 64).is_ok());
        let mut a = e.waiting.pop_front().unwrap();
        let mut b = e.waiting.pop_front().unwrap();
        a.absorb(&[vec![1.0, 2.0], vec![3.0, 4.0]]);
        a.absorb(&[vec![5.0, 9.0]]);
        b.absorb(&[vec![-1.0, 0.5]]);
        e.complete(b);
        assert!(out.lock().unwrap().is_none(), "replies once every text is done");
        e.complete(a);
        let v = out.lock().unwrap().take().unwrap().unwrap();
        assert_eq!(v, vec![vec![3.0, 5.0], vec![-1.0, 0.5]]);

        let (reply, out) = capture();
        let req = EmbedRequest { texts: vec![vec![1, 2]], pooling: Pooling::Last, experts: ExpertSet::none(), reply };
        assert!(e.submit(req, 16, 64).is_ok());
        let mut a = e.waiting.pop_front().unwrap();
        a.absorb(&[vec![1.0]]);
        a.absorb(&[vec![2.0]]);
        e.complete(a);
        assert_eq!(out.lock().unwrap().take().unwrap().unwrap(), vec![vec![2.0]]);
    }

    #[test]
    fn refuses_empty_and_oversized_texts_and_fails_whole_requests() {
        let mut e = Embeddings::default();
        for (texts, code) in [(vec![vec![1], vec![]], "INVALID_ARGUMENT"), (vec![vec![1; 17]], "CONTEXT_OVERFLOW")] {
            let (reply, _) = capture();
            let req = EmbedRequest { texts, pooling: Pooling::Mean, experts: ExpertSet::none(), reply };
            let (err, _) = e.submit(req, 16, 64).err().unwrap();
            assert_eq!(err.code(), code);
        }
        let (reply, _) = capture();
        let req = EmbedRequest { texts: vec![vec![1; 9]], pooling: Pooling::Mean, experts: ExpertSet::none(), reply };
        assert_eq!(e.submit(req, 16, 8).err().unwrap().0.code(), "KV_CACHE_EXHAUSTED");
        assert!(e.is_idle());

        let (reply, out) = capture();
        let req = EmbedRequest { texts: vec![vec![1], vec![2]], pooling: Pooling::Mean, experts: ExpertSet::none(), reply };
        assert!(e.submit(req, 16, 64).is_ok());
        let running = e.waiting.pop_front().unwrap();
        e.running.push(running);
        let jobs = e.fail(1, EngineError::Internal("x".into()));
        assert_eq!(jobs.len(), 2);
        assert!(e.is_idle());
        assert_eq!(out.lock().unwrap().take().unwrap().unwrap_err().code(), "INTERNAL");
    }
}
