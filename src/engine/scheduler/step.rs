//! One step of the engine loop: plan the rows of every running request within the token
//! budget, run the batched forward pass (grammar masks computed alongside), then pool the
//! embedding rows and sample the generated ones, speculative drafts verified.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{Planned, Row, Scheduler, SessionState};
use crate::engine::embedding::{Embeddings, TextJob};
use crate::engine::profile::Phase;
use crate::engine::readback::{read_rows, RowLogits};
use crate::engine::request::FinishReason;
use crate::engine::sequence::Sequence;
use crate::error::{panic_message, EngineError, Result};
use crate::model::decoder::{Logits, PassOutput, SeqChunk};
use crate::sampling::{Constraint, Sampled, Sampler};
use crate::tokenizer::Tokenizer;
use llguidance::toktrie::SimpleVob;

impl Scheduler {
    /// One batched step; a failure fails the requests of the batch.
    pub(super) fn step_guarded(&mut self) {
        let outcome = catch_unwind(AssertUnwindSafe(|| self.step()));
        let err = match outcome {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e,
            Err(p) => EngineError::Internal(format!("engine step panicked: {}", panic_message(&*p))),
        };
        for seq in std::mem::take(&mut self.running) {
            self.fail(seq, err.clone());
        }
        for id in Embeddings::requests_of(&self.embeds.running) {
            for mut j in self.embeds.fail(id, err.clone()) {
                self.kv.free(&mut j.table);
            }
        }
    }

    /// One forward pass over every running request, then sampling where a prompt or a decode
    /// row completed, and pooling for the embedding rows.
    fn step(&mut self) -> Result<()> {
        self.profile.start();
        let plan = self.plan_step();
        self.profile.lap(Phase::Plan);

        // 2. The batched forward pass, while a worker computes the grammar masks of the
        //    constrained requests (they depend only on the tokens already sampled).
        let mut constrained: Vec<(usize, Box<Constraint>)> =
            self.running.iter_mut().enumerate().filter_map(|(i, seq)| seq.constraint.take().map(|c| (i, c))).collect();
        for (i, c) in constrained.iter_mut() {
            let seq = &self.running[*i];
            c.set_remaining(seq.max_tokens.saturating_sub(seq.usage.completion_tokens), seq.max_tokens);
        }
        let mut out = None;
        let forward = || {
            let chunks: Vec<SeqChunk> = plan
                .iter()
                .map(|&Planned { row, pos, n }| {
                    let (tokens, n_virtual, table, target, experts): (&[u32], _, _, _, _) = match row {
                        Row::Generate(i) => {
                            let seq = &self.running[i];
                            let st = &self.sessions[&seq.session];
                            (&st.tokens, st.n_virtual, &st.table, st.target(), &seq.experts)
                        }
                        Row::Embed(j) => {
                            let job = &self.embeds.running[j];
                            (&job.tokens, job.n_virtual, &job.table, job.target(), &job.experts)
                        }
                    };
                    let (blocks, state) = (table.groups(), table.state());
                    // A verification keeps each row's recurrent state: the drafts a sample
                    // rejects are rolled back to the last one it keeps.
                    let steps = matches!(row, Row::Generate(i) if pos + n == target && self.running[i].drafted() > 0);
                    let logits = match row {
                        Row::Embed(_) => Logits::Hidden,
                        // A speculative step needs the pending token's row and each draft's.
                        Row::Generate(i) if pos + n == target && self.running[i].drafted() > 0 => Logits::All,
                        Row::Generate(_) if pos + n == target => Logits::Last,
                        Row::Generate(_) => Logits::None,
                    };
                    let virtual_rows = pos.min(n_virtual)..(pos + n).min(n_virtual);
                    let t0 = pos.max(n_virtual) - n_virtual;
                    let t1 = pos + n - n_virtual;
                    SeqChunk {
                        tokens: &tokens[t0..t1],
                        virtual_rows,
                        pos,
                        seq_len: target,
                        blocks,
                        state,
                        steps: steps && state.is_some(),
                        logits,
                        experts,
                    }
                })
                .collect();
            self.model.forward_batch(&chunks, self.kv.store())
        };
        if constrained.is_empty() {
            out = Some(forward());
        } else {
            crate::engine::prepare::pool()?.in_place_scope(|scope| {
                scope.spawn(|_| {
                    for (_, c) in constrained.iter_mut() {
                        // A failure leaves the constraint without a mask: that request fails below.
                        let _ = c.compute_mask();
                    }
                });
                out = Some(forward());
            });
        }
        for (i, c) in constrained {
            self.running[i].constraint = Some(c);
        }
        let PassOutput { logits, hidden, greedy } = out.expect("the forward pass ran")?;
        self.profile.lap(Phase::Forward);
        let rows: Vec<RowLogits> = match logits {
            Some(l) => {
                if self.profile.on() {
                    l.device().synchronize()?;
                    self.profile.lap(Phase::Device);
                }
                read_rows(&l, &self.greedy_rows(&plan), greedy.as_ref())?
            }
            None => Vec::new(),
        };
        let hidden: Vec<Vec<f32>> = match hidden {
            Some(h) => h.to_vec2()?,
            None => Vec::new(),
        };
        self.profile.lap(Phase::Readback);
        self.pool_embeddings(&plan, &hidden);
        self.advance_and_sample(&plan, &rows);
        self.profile.lap(Phase::Sample);
        self.profile.step_done(plan.iter().map(|p| p.n).sum());
        Ok(())
    }

    /// For each logits row of the pass (in plan order), whether its request wants only the
    /// greedy token and its logprob (no grammar mask, see [`Sampler::greedy_only`]).
    fn greedy_rows(&self, plan: &[Planned]) -> Vec<bool> {
        let mut out = Vec::new();
        for &Planned { row, pos, n } in plan {
            let Row::Generate(i) = row else { continue };
            let seq = &self.running[i];
            if pos + n == self.sessions[&seq.session].target() {
                let greedy = seq.constraint.is_none() && seq.forced_token().is_none() && seq.sampler.greedy_only();
                out.extend(std::iter::repeat_n(greedy, 1 + seq.drafted()));
            }
        }
        out
    }

    /// Step 1: a row for each decoding request, then embedding texts and prompt chunks within
    /// the per-step token budget, grouped by expert set (each set is one adapter segment).
    /// Embedding texts take at most half the budget while a prompt is being read.
    fn plan_step(&mut self) -> Vec<Planned> {
        let mut decoding = 0;
        for seq in &mut self.running {
            let st = self.sessions.get_mut(&seq.session).expect("reaped");
            if st.table.len() == st.target() {
                st.tokens.push(seq.last_token.expect("a decode step follows a sampled token"));
                // Drafts fit the positions the request holds and the tokens it may still emit
                // (the pass emits at most one more than it drafts).
                let room =
                    seq.limit.saturating_sub(st.target()).min(seq.max_tokens.saturating_sub(seq.usage.completion_tokens + 1));
                let room = room.min(self.kv.draft_cap());
                let forcing = seq.forced_token().is_some();
                if let Some(d) = seq.drafter.as_mut().filter(|_| !forcing) {
                    st.tokens.extend_from_slice(d.propose(&st.tokens, room));
                }
            }
            let left = st.target() - st.table.len();
            if left == 1 + seq.drafted() {
                decoding += left;
            }
        }
        let mut budget = self.step_tokens.saturating_sub(decoding).max(self.kv.block_size());
        let mut plan: Vec<Planned> = Vec::with_capacity(self.running.len() + self.embeds.running.len());
        let prefilling = self.running.iter().any(|seq| {
            let st = &self.sessions[&seq.session];
            st.target() - st.table.len() > 1 + seq.drafted()
        });
        let mut embed_budget = if prefilling { budget / 2 } else { budget };
        let bs = self.kv.block_size();
        for (j, job) in self.embeds.running.iter().enumerate() {
            let writable = job.table.writable_until(bs) - job.table.len();
            let n = (job.target() - job.table.len()).min(embed_budget).min(writable);
            if n == 0 {
                break;
            }
            embed_budget -= n;
            budget -= n;
            plan.push(Planned { row: Row::Embed(j), pos: job.table.len(), n });
        }
        for (i, seq) in self.running.iter().enumerate() {
            let st = &self.sessions[&seq.session];
            let left = st.target() - st.table.len();
            let decode_rows = 1 + seq.drafted();
            // A window group lists blocks for one pass ahead of its window (at least a decode
            // step with every draft); a prompt chunk stops there.
            let writable = st.table.writable_until(bs).saturating_sub(st.table.len());
            let mut n = if left == decode_rows { left } else { left.min(budget).min(writable) };
            if n < left && n > bs && self.kv.has_states() {
                // A prompt chunk of a model with recurrent layers ends at a block boundary, where
                // its states can be kept for prompts sharing the prefix.
                n -= (st.table.len() + n) % bs;
            }
            // Or where the prefix index's blocks end past any snapshot: the next prompt sharing
            // them starts from the state there.
            if let Some(at) = st.snapshot_at.filter(|&at| at > st.table.len() && at < st.table.len() + n) {
                n = at - st.table.len();
            }
            if n == 0 {
                continue;
            }
            if left > decode_rows {
                budget -= n;
            }
            plan.push(Planned { row: Row::Generate(i), pos: st.table.len(), n });
        }
        plan.sort_by_cached_key(|p| match p.row {
            Row::Generate(i) => self.running[i].experts.key(),
            Row::Embed(j) => self.embeds.running[j].experts.key(),
        });
        plan
    }

    /// Step 3a: advance the embedding texts' tables and pool their hidden rows (`hidden`, in
    /// plan order); a finished text frees its blocks.
    fn pool_embeddings(&mut self, plan: &[Planned], hidden: &[Vec<f32>]) {
        let mut next_row = 0;
        let mut finished = Vec::new();
        for &Planned { row, pos, n } in plan {
            let Row::Embed(j) = row else { continue };
            let job = &mut self.embeds.running[j];
            let token_rows = pos + n - pos.max(job.n_virtual).min(pos + n);
            job.absorb(&hidden[next_row..next_row + token_rows]);
            next_row += token_rows;
            job.table.advance(pos + n);
            self.kv.roll(&mut job.table);
            if job.is_done() {
                finished.push(j);
            }
        }
        finished.sort_unstable_by(|a, b| b.cmp(a));
        for j in finished {
            let mut job: TextJob = self.embeds.running.remove(j);
            self.kv.free(&mut job.table);
            self.embeds.complete(job);
        }
    }

    /// Step 3b: advance the tables, register filled blocks, sample where logits came back
    /// (`rows`, in plan order), and finish the requests that ended.
    fn advance_and_sample(&mut self, plan: &[Planned], rows: &[RowLogits]) {
        let mut next_row = 0;
        let mut done = Vec::new();
        let mut failed = Vec::new();
        let mut failed_with: Vec<(usize, EngineError)> = Vec::new();
        for &Planned { row, pos, n } in plan {
            let Row::Generate(i) = row else { continue };
            let seq = &mut self.running[i];
            let st = self.sessions.get_mut(&seq.session).expect("reaped");
            let drafted = seq.drafted();
            if drafted > 0 {
                let ended = verify_drafts(seq, st, pos, &rows[next_row..next_row + 1 + drafted], &self.tokenizer);
                next_row += 1 + drafted;
                if let Some(slot) = st.table.state() {
                    // The recurrent state as it stood after the last row kept.
                    let used = st.table.len() - pos;
                    if let Err(e) = self.kv.store().states().settle(slot, used - 1, pos + used) {
                        failed_with.push((i, e));
                        continue;
                    }
                }
                self.kv.cache_full_blocks(&st.table, pos, st.shareable, &st.set_key, |p| st.key_at(p));
                self.kv.roll(&mut st.table);
                if let Some(reason) = ended {
                    done.push((i, reason));
                }
                continue;
            }
            st.table.advance(pos + n);
            self.kv.cache_full_blocks(&st.table, pos, st.shareable, &st.set_key, |p| st.key_at(p));
            self.kv.roll(&mut st.table);
            if n > 1 {
                // A prompt chunk that ends a registered block: its recurrent states are kept
                // for prompts that share the prefix.
                if let Err(e) = self.kv.snapshot(&st.table) {
                    failed_with.push((i, e));
                    continue;
                }
            }
            if pos + n < st.target() {
                continue;
            }
            let row = &rows[next_row];
            next_row += 1;
            if seq.last_token.is_none() {
                seq.mark_prefill_done();
            }
            // A forced token (closing a thought at its budget) is sampled under a mask that
            // allows only it: its logprob is the model's own.
            let only = seq.forced_token().map(|t| only_token(t, row));
            let mask = match (&only, &seq.constraint) {
                (Some(only), _) => Some(only),
                (None, Some(c)) if !c.has_mask() => {
                    failed.push(i);
                    continue;
                }
                (None, Some(c)) => c.mask(),
                (None, None) => None,
            };
            let sampled = sample_row(&mut seq.sampler, row, &st.tokens, mask);
            let room_left = st.table.len() < seq.limit;
            if let Some(reason) = seq.on_token(&self.tokenizer, sampled, room_left) {
                done.push((i, reason));
            }
        }
        let constraint = || EngineError::Internal("the output constraint failed to compute the allowed tokens".into());
        let mut ended: Vec<(usize, std::result::Result<FinishReason, EngineError>)> = done
            .into_iter()
            .map(|(i, r)| (i, Ok(r)))
            .chain(failed.into_iter().map(|i| (i, Err(constraint()))))
            .chain(failed_with.into_iter().map(|(i, e)| (i, Err(e))))
            .collect();
        ended.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        ended.dedup_by_key(|(i, _)| *i);
        for (i, reason) in ended {
            let seq = self.running.remove(i);
            match reason {
                Ok(reason) => self.finish(seq, reason),
                Err(e) => self.fail(seq, e),
            }
        }
    }
}

/// A mask over `row`'s vocabulary that allows only `token`.
fn only_token(token: u32, row: &RowLogits) -> SimpleVob {
    let n = match row {
        RowLogits::Full(r) => r.len(),
        RowLogits::Greedy { .. } => 0,
    };
    let mut v = SimpleVob::alloc(n.max(token as usize + 1));
    v.allow_token(token);
    v
}

/// Samples one row of logits with `context` as the tokens before it (for penalties).
fn sample_row(sampler: &mut Sampler, row: &RowLogits, context: &[u32], mask: Option<&SimpleVob>) -> Sampled {
    match row {
        RowLogits::Full(row) => sampler.sample_masked(row, context, mask),
        // Only rows without a mask are reduced on the device.
        &RowLogits::Greedy { token, log_sum } => Sampled { token, logprob: -log_sum, top_logprobs: Vec::new() },
    }
}

/// Step 3b for a speculative chunk (see `engine::speculative`): the chunk evaluated the pending
/// token and the drafts after it from `pos`; `rows` are their logits. Samples each row as plain
/// decoding would, keeps drafts while they equal the sampled token, then drops the rest from
/// the stream; the table advances over the evaluated positions that stay. Returns why the
/// request ended, if it did.
fn verify_drafts(
    seq: &mut Sequence,
    st: &mut SessionState,
    pos: usize,
    rows: &[RowLogits],
    tok: &Tokenizer,
) -> Option<FinishReason> {
    // Index in `st.tokens` of the token row 0 evaluated; the drafts follow it there.
    let base = pos - st.n_virtual;
    let drafted = rows.len() - 1;
    let mut used = 0;
    let mut accepted = 0;
    let mut ended = None;
    for (r, row) in rows.iter().enumerate() {
        let sampled = sample_row(&mut seq.sampler, row, &st.tokens[..base + r + 1], None);
        let hit = r < drafted && st.tokens[base + r + 1] == sampled.token;
        used = r + 1;
        ended = seq.on_token(tok, sampled, pos + used < seq.limit);
        accepted += hit as usize;
        // A thought that reached its budget is closed by forced tokens, not by the drafts.
        if ended.is_some() || !hit || seq.forced_token().is_some() {
            break;
        }
    }
    st.tokens.truncate(base + used);
    st.table.advance(pos + used);
    seq.usage.draft_tokens += drafted;
    seq.usage.accepted_draft_tokens += accepted;
    if let Some(d) = &mut seq.drafter {
        d.verified(accepted);
    }
    ended
}
