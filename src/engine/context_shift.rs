//! Keeping a long chat inside the context window (`contextShift: 'drop-oldest'`).
//!
//! A session created with [`ContextShift::DropOldest`] never fails a chat turn with
//! `CONTEXT_OVERFLOW` while its newest messages fit: before the turn runs, the oldest whole
//! turns of its history (a user message and the replies and tool results that follow it) are
//! dropped until the rendered conversation leaves room for the answer. The leading system
//! messages always stay. Because the kept conversation starts with the same system prompt, the
//! tokens of that prefix are still in the session's cache and are not evaluated again; what
//! follows the first dropped turn is.
//!
//! The window is found by bisecting over the turn boundaries, so a turn renders the template
//! about log2(turns) + 1 times, not once per dropped turn.

use crate::error::{EngineError, Result};
use crate::tokenizer::ChatMessage;

/// What a session does when a chat turn would not fit in the context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContextShift {
    /// Fail with `CONTEXT_OVERFLOW`.
    #[default]
    None,
    /// Drop the oldest turns of the history (the system prompt stays).
    DropOldest,
}

impl ContextShift {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Self::None),
            "drop-oldest" => Ok(Self::DropOldest),
            other => {
                let shown: String = other.chars().take(40).collect();
                Err(EngineError::InvalidArgument(format!("unknown contextShift '{shown}' (none, drop-oldest)")))
            }
        }
    }
}

/// The tokens a chat turn runs on, and how many history messages (after the leading system
/// messages) were left out to fit them.
#[derive(Debug, PartialEq, Eq)]
pub struct Window {
    pub ids: Vec<u32>,
    pub dropped: usize,
}

/// The room a turn keeps for its answer when it has to drop turns: `maxTokens`, or a quarter
/// of the context when unset, and never more than half of it (a long `maxTokens` must not
/// empty the conversation).
pub fn answer_room(max_tokens: Option<usize>, context_length: usize) -> usize {
    max_tokens.unwrap_or(context_length / 4).min(context_length / 2).max(1)
}

/// How many messages at the start of `history` are system messages (they are never dropped).
pub fn leading_system(history: &[ChatMessage]) -> usize {
    history.iter().take_while(|m| m.role == "system").count()
}

/// Renders `history` + `new` with `encode`; when that is longer than `budget` tokens, drops
/// the oldest turns of `history` (never its leading system messages, never `new`) until it is
/// not. When even the system messages and `new` alone are too long, returns that shortest
/// conversation: the caller reports the overflow.
pub fn fit(
    history: &[ChatMessage],
    new: &[ChatMessage],
    budget: usize,
    encode: impl Fn(&[ChatMessage]) -> Result<Vec<u32>>,
) -> Result<Window> {
    let head = leading_system(history);
    let render = |cut: usize| -> Result<Vec<u32>> {
        let kept: Vec<ChatMessage> = history[..head].iter().chain(&history[cut..]).chain(new).cloned().collect();
        encode(&kept)
    };
    let ids = render(head)?;
    if ids.len() <= budget {
        return Ok(Window { ids, dropped: 0 });
    }
    // Where a turn starts: a user message, or the end of the history (every turn dropped).
    let cuts: Vec<usize> = (head + 1..history.len()).filter(|&i| history[i].role == "user").chain([history.len()]).collect();
    let last = *cuts.last().expect("the end of the history is always a cut");
    if last == head {
        return Ok(Window { ids, dropped: 0 });
    }
    // The first cut whose window fits; the rendering shrinks as turns go, so bisect. When no
    // cut fits, the last one (the shortest conversation).
    let (mut lo, mut hi) = (0, cuts.len() - 1);
    let mut best: Option<(usize, Vec<u32>)> = None;
    while lo <= hi {
        let mid = lo + (hi - lo) / 2;
        let ids = render(cuts[mid])?;
        if ids.len() <= budget {
            best = Some((cuts[mid], ids));
            if mid == 0 {
                break;
            }
            hi = mid - 1;
        } else {
            lo = mid + 1;
        }
    }
    let (cut, ids) = match best {
        Some(b) => b,
        None => (last, render(last)?),
    };
    Ok(Window { ids, dropped: cut - head })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage::new(role, content)
    }

    /// One token per character of each message, plus two of markup per message.
    fn encode(m: &[ChatMessage]) -> Result<Vec<u32>> {
        Ok(m.iter().flat_map(|m| std::iter::repeat_n(0u32, m.content.len() + 2)).collect())
    }

    fn chat(turns: usize) -> Vec<ChatMessage> {
        let mut h = vec![msg("system", "sys")];
        for i in 0..turns {
            h.push(msg("user", &format!("question {i}")));
            h.push(msg("assistant", &format!("answer {i}")));
        }
        h
    }

    #[test]
    fn a_conversation_that_fits_is_kept_whole() {
        let h = chat(3);
        let new = [msg("user", "next")];
        let w = fit(&h, &new, 1000, encode).unwrap();
        assert_eq!(w.dropped, 0);
        assert_eq!(w.ids.len(), encode(&[h, new.to_vec()].concat()).unwrap().len());
    }

    #[test]
    fn the_oldest_whole_turns_go_first_and_the_system_prompt_stays() {
        let h = chat(10);
        let new = [msg("user", "next")];
        // system 5, each turn 12 + 10 = 22, new 6: three turns fit in 5 + 66 + 6 = 77.
        for (budget, kept_turns) in [(77, 3), (98, 3), (99, 4), (11, 0), (32, 0), (33, 1)] {
            let w = fit(&h, &new, budget, encode).unwrap();
            assert_eq!(w.dropped, 2 * (10 - kept_turns), "budget {budget}");
            let kept: Vec<ChatMessage> = h[..1].iter().chain(&h[1 + w.dropped..]).chain(&new).cloned().collect();
            assert_eq!(w.ids, encode(&kept).unwrap());
            assert!(w.ids.len() <= budget);
        }
    }

    #[test]
    fn a_turn_is_dropped_with_its_tool_calls_and_results() {
        let mut h = vec![msg("system", "s"), msg("user", "a"), msg("assistant", "call"), msg("tool", "result")];
        h.extend([msg("assistant", "done"), msg("user", "b"), msg("assistant", "c")]);
        let w = fit(&h, &[msg("user", "d")], 16, encode).unwrap();
        // Dropping only the first user message would leave its calls behind: the whole turn goes.
        assert_eq!(w.dropped, 4);
    }

    #[test]
    fn when_nothing_fits_the_shortest_conversation_is_returned() {
        let h = chat(4);
        let new = [msg("user", "a very long question that alone does not fit")];
        let w = fit(&h, &new, 10, encode).unwrap();
        assert_eq!(w.dropped, 8);
        assert_eq!(w.ids, encode(&[h[..1].to_vec(), new.to_vec()].concat()).unwrap());
    }

    #[test]
    fn without_a_system_prompt_or_history_nothing_breaks() {
        let new = [msg("user", "hello")];
        assert_eq!(fit(&[], &new, 1, encode).unwrap().dropped, 0);
        let h = vec![msg("user", "x"), msg("assistant", "y")];
        assert_eq!(fit(&h, &new, 8, encode).unwrap().dropped, 2);
    }

    #[test]
    fn rendering_errors_pass_through() {
        let bad = |_: &[ChatMessage]| -> Result<Vec<u32>> { Err(EngineError::InvalidModel("template".into())) };
        assert!(fit(&chat(2), &[msg("user", "q")], 1, bad).is_err());
    }

    #[test]
    fn the_answer_room_is_bounded() {
        assert_eq!(answer_room(None, 256), 64);
        assert_eq!(answer_room(Some(10), 256), 10);
        assert_eq!(answer_room(Some(1 << 40), 256), 128);
        assert_eq!(answer_room(Some(0), 256), 1);
        assert_eq!(ContextShift::parse("drop-oldest").unwrap(), ContextShift::DropOldest);
        assert!(ContextShift::parse("drop-newest").is_err());
    }
}
