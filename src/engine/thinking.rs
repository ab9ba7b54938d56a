//! Thinking models: a request's thought, apart from its answer, under a token budget.
//!
//! Design note
//! -----------
//! * Which markers a model thinks between is data (`tokenizer::reasoning`): the chat
//!   template's, else those an expert of the request declares in its manifest.
//! * When the request is prepared ([`settle_prompt`]), the rendered prompt is made to leave the
//!   model where the request asks: with thinking off, a template that ignored
//!   `enable_thinking: false` gets the empty thought the Qwen3 template writes. The phase the
//!   prompt ends in (inside a thought, past one, neither) starts the request's
//!   [`ReasoningStream`].
//! * While the request runs ([`Thinking`]), each token's text is split into thought and
//!   answer. Tokens written inside the thought count against the budget; at the budget the
//!   thought is closed by forcing the tokens of the closing marker (as llama.cpp's reasoning
//!   budget does), and the answer follows. A forced token is sampled under a mask that allows
//!   only it, so its logprob is the model's own.
//! * A grammar (a response format, a forced tool call) applies to the answer only: it waits
//!   while the model thinks. A constrained request on a template that lets the model decide
//!   whether to think starts with the opening marker forced, so the grammar knows where the
//!   answer starts.

use std::collections::VecDeque;

use super::request::GenerateOptions;
use crate::error::{EngineError, Result};
use crate::experts::ExpertSet;
use crate::tokenizer::reasoning::{Phase, ReasoningStream, ReasoningSyntax, Split};
use crate::tokenizer::Tokenizer;

/// Largest thought budget (tokens) a request may set.
pub const MAX_THINKING_BUDGET: usize = i32::MAX as usize;
/// Prompt tokens decoded to find where the prompt leaves the model.
const TAIL_TOKENS: usize = 16;

/// How a prepared request thinks.
#[derive(Debug)]
pub struct ThinkingPlan {
    pub syntax: ReasoningSyntax,
    /// Where the prompt leaves the model.
    pub phase: Phase,
    /// Most thought tokens (`None`: no limit).
    pub budget: Option<usize>,
    /// The tokens that close a thought at the budget.
    pub closing: Vec<u32>,
    /// The tokens that open a thought (forced first under a grammar, see the module note).
    pub opening: Vec<u32>,
}

/// The thinking markers of a request: the template's, else its experts'.
pub fn syntax_for(tok: &Tokenizer, experts: &ExpertSet) -> Option<ReasoningSyntax> {
    ReasoningSyntax::detect(tok.chat_template())
        .or_else(|| experts.experts().iter().find_map(|e| e.manifest.as_ref().and_then(|m| m.reasoning.clone())))
}

/// Whether the request thinks (`None`: as the template decides) and its budget: a budget of 0
/// is thinking off; a budget with thinking off is refused.
pub fn requested(o: &GenerateOptions) -> Result<(Option<bool>, Option<usize>)> {
    match (o.enable_thinking, o.thinking_budget) {
        (_, Some(b)) if b > MAX_THINKING_BUDGET => Err(EngineError::InvalidArgument(format!(
            "the thinking budget must be at most {MAX_THINKING_BUDGET} tokens, got {b}"
        ))),
        (Some(false), Some(b)) if b > 0 => {
            Err(EngineError::InvalidArgument("a thinking budget was given with thinking disabled; give one or the other".into()))
        }
        (_, Some(0)) => Ok((Some(false), None)),
        (e, Some(b)) => Ok((e.or(Some(true)), Some(b))),
        (e, None) => Ok((e, None)),
    }
}

fn tail(tok: &Tokenizer, ids: &[u32]) -> Result<String> {
    tok.decode(&ids[ids.len().saturating_sub(TAIL_TOKENS)..], false).map_err(EngineError::InvalidModel)
}

fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    tok.encode_text(text, false, true).map_err(EngineError::InvalidModel)
}

/// Makes a rendered chat prompt (`ids`) leave the model where `enabled` says: with thinking
/// off, past an (empty) thought. Called on every rendering of the conversation.
pub fn settle_prompt(tok: &Tokenizer, syntax: &ReasoningSyntax, enabled: Option<bool>, ids: &mut Vec<u32>) -> Result<()> {
    if enabled != Some(false) {
        return Ok(());
    }
    match Phase::after_prompt(syntax, &tail(tok, ids)?) {
        Phase::Closed | Phase::Answer => {}
        Phase::Thought => ids.extend(encode(tok, &syntax.closing())?),
        Phase::Start => ids.extend(encode(tok, &syntax.empty_thought())?),
    }
    Ok(())
}

/// The plan of a request whose prompt (`ids`, settled) is ready.
pub fn plan(tok: &Tokenizer, syntax: ReasoningSyntax, budget: Option<usize>, ids: &[u32]) -> Result<ThinkingPlan> {
    Ok(ThinkingPlan {
        phase: Phase::after_prompt(&syntax, &tail(tok, ids)?),
        budget,
        closing: encode(tok, &syntax.closing())?,
        opening: encode(tok, &format!("{}\n", syntax.open))?,
        syntax,
    })
}

/// A running request's thought (see the module note).
#[derive(Debug)]
pub struct Thinking {
    stream: ReasoningStream,
    budget: Option<usize>,
    closing: Vec<u32>,
    /// Tokens to emit next, whatever the model prefers.
    forced: VecDeque<u32>,
    /// Tokens the model wrote inside the thought (forced ones not counted).
    thought_tokens: usize,
    /// Whether the budget already closed the thought.
    cut: bool,
    /// The thought so far.
    pub thought: String,
}

impl Thinking {
    /// `constrained`: the answer has a grammar (forces the opening marker when the model may
    /// still choose whether to think).
    pub fn new(plan: ThinkingPlan, constrained: bool) -> Self {
        let forced = if constrained && plan.phase == Phase::Start { plan.opening.into() } else { VecDeque::new() };
        Self {
            stream: ReasoningStream::new(plan.syntax, plan.phase),
            budget: plan.budget,
            closing: plan.closing,
            forced,
            thought_tokens: 0,
            cut: false,
            thought: String::new(),
        }
    }

    /// The token the request must emit next, if one is forced.
    pub fn forced(&self) -> Option<u32> {
        self.forced.front().copied()
    }

    /// Whether the model writes its answer now: past the thought and the closing tokens
    /// forced after it (a grammar applies from here on).
    pub fn answering(&self) -> bool {
        matches!(self.stream.phase(), Phase::Closed | Phase::Answer) && self.forced.is_empty()
    }

    /// Takes the text of the token just emitted (the forced one, while one is) and returns
    /// what it released of the answer and the thought, and whether the token belongs to the
    /// thought (it opened, continued or closed it, or was forced there).
    pub fn push(&mut self, delta: &str) -> (Split, bool) {
        let before = self.stream.phase();
        let forced = self.forced.pop_front().is_some();
        if !forced && before == Phase::Thought {
            self.thought_tokens += 1;
        }
        let out = self.stream.push(delta);
        let thought = forced || before == Phase::Thought || self.stream.phase() == Phase::Thought;
        self.thought.push_str(&out.thought);
        let over = self.budget.is_some_and(|b| self.thought_tokens >= b);
        if over && !self.cut && self.stream.phase() == Phase::Thought && self.forced.is_empty() {
            self.cut = true;
            self.forced.extend(&self.closing);
        }
        (out, thought)
    }

    /// The output ended: `rest` (text held back elsewhere, no new token) and what was held
    /// back here.
    pub fn finish(&mut self, rest: &str) -> Split {
        let mut out = self.stream.push(rest);
        let tail = self.stream.finish();
        out.answer.push_str(&tail.answer);
        out.thought.push_str(&tail.thought);
        self.thought.push_str(&out.thought);
        out
    }
}
