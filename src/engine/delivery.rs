//! What a consumer saw of a request.
//!
//! The engine runs ahead of its consumer: by the time a JS loop `break`s after three chunks,
//! the engine may have produced a fourth, or finished the whole answer. The summary, the
//! session's history and the session's token stream must hold what the consumer received and
//! no more, or the next turn builds on text nobody saw. [`Delivery`] sits on the consumer's
//! side of a request's event channel: it records the text each chunk carried, learns how many
//! chunks were delivered when the consumer leaves, and when the summary arrives cuts it (and
//! the history entry, and the session's stream, through [`Command::Undeliver`]) to that.

use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use super::request::{Command, Completion, FinishReason, SessionShared, TokenChunk};

pub struct Delivery {
    session: u64,
    shared: Arc<SessionShared>,
    tx: Sender<Command>,
    /// The summary's text and thought lengths after each chunk that passed.
    chunk_ends: Vec<(usize, usize)>,
    text_len: usize,
    reasoning_len: usize,
    delivered: Option<usize>,
}

impl Delivery {
    pub(super) fn new(session: u64, shared: Arc<SessionShared>, tx: Sender<Command>) -> Self {
        Self { session, shared, tx, chunk_ends: Vec::new(), text_len: 0, reasoning_len: 0, delivered: None }
    }

    /// A chunk passed on its way to the consumer.
    pub fn passed(&mut self, chunk: &TokenChunk) {
        self.text_len += chunk.text.len();
        self.reasoning_len += chunk.reasoning.len();
        self.chunk_ends.push((self.text_len, self.reasoning_len));
    }

    /// The consumer left after `n` chunks (the smallest count given wins).
    pub fn left_after(&mut self, n: usize) {
        self.delivered = Some(self.delivered.map_or(n, |d| d.min(n)));
    }

    /// Cuts `c` (the request's summary) to what was delivered; when the consumer saw less than
    /// was produced the request counts as cancelled, and the session's history entry and token
    /// stream are cut too unless a newer request already started on the session.
    pub fn settle(&mut self, c: &mut Completion) {
        let produced = c.tokens.len();
        let Some(kept) = self.delivered.filter(|&n| n < produced) else { return };
        let full = (c.text.len(), c.reasoning.as_ref().map_or(0, String::len));
        let (text_len, reasoning_len) = kept.checked_sub(1).map_or((0, 0), |i| self.chunk_ends.get(i).copied().unwrap_or(full));
        if c.text.is_char_boundary(text_len) {
            c.text.truncate(text_len);
        }
        if let Some(r) = c.reasoning.as_mut().filter(|r| r.is_char_boundary(reasoning_len)) {
            r.truncate(reasoning_len);
        }
        c.tokens.truncate(kept);
        c.usage.completion_tokens = kept;
        c.finish_reason = FinishReason::Cancelled;
        // The consumer did not see the whole answer, so not its calls either.
        c.tool_calls.clear();
        if self.shared.busy.load(Ordering::Acquire) {
            return;
        }
        if let Some(i) = c.history_index {
            if let Some(m) = self.shared.history.lock().unwrap().get_mut(i) {
                m.content.clone_from(&c.text);
                m.reasoning = c.reasoning.clone().filter(|r| !r.is_empty());
                m.tool_calls.clear();
            }
        }
        let _ = self.tx.send(Command::Undeliver { id: self.session, tokens: produced - kept });
    }
}
