//! Thinking models, on the text side: the markers a family writes around a thought (as data,
//! [`ReasoningSyntax`]), where a rendered prompt leaves the model ([`Phase::after_prompt`]),
//! and [`ReasoningStream`], which splits a model's output into thought and answer as it
//! streams.
//!
//! Design note
//! -----------
//! * A family is a row of data, like `tools::ToolSyntax`: the opening and closing markers.
//!   Qwen3, Qwen3.5 and SmolLM3 write `<think>` … `</think>`; their templates contain both
//!   markers, which is how a template is recognised ([`ReasoningSyntax::detect`]). An expert
//!   trained to think on a base whose template knows nothing of it declares its markers in its
//!   manifest (`reasoning: { open, close }`).
//! * Templates differ in what they put after the assistant's header: Qwen3 nothing (the model
//!   opens the thought), Qwen3.5 the opening marker, and with thinking disabled an empty thought
//!   (`<think>\n\n</think>\n\n`). So the stream starts in the phase the prompt's last text says
//!   ([`Phase::after_prompt`]), and a template that ignores `enable_thinking: false` gets the
//!   empty thought appended by the caller ([`ReasoningSyntax::empty_thought`]).
//! * The thought's text is what lies between the markers, trimmed of the whitespace around
//!   it; the answer is what follows the closing marker, without its leading whitespace. Text
//!   that could still become a marker is held back, across token boundaries, like a stop string.
//! * A thought cut short by a budget is closed with [`ReasoningSyntax::closing`], the same text
//!   the model writes, so the answer follows it as after a thought of its own.

/// The markers around a thought.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReasoningSyntax {
    pub open: String,
    pub close: String,
}

/// Longest marker accepted from a manifest.
pub const MAX_MARKER_BYTES: usize = 64;

impl ReasoningSyntax {
    /// `<think>` … `</think>`: Qwen3, Qwen3.5, SmolLM3 (and DeepSeek-R1's distills).
    pub fn think() -> Self {
        Self { open: "<think>".into(), close: "</think>".into() }
    }

    /// The syntax of a chat template that writes thoughts (`None`: it does not).
    pub fn detect(template: Option<&str>) -> Option<Self> {
        let t = Self::think();
        template.filter(|src| src.contains(&t.open) && src.contains(&t.close)).map(|_| t)
    }

    /// Markers given by a manifest: non-empty, at most [`MAX_MARKER_BYTES`], without leading
    /// or trailing whitespace, and different.
    pub fn new(open: &str, close: &str) -> Result<Self, String> {
        for (name, m) in [("open", open), ("close", close)] {
            if m.is_empty() || m.len() > MAX_MARKER_BYTES || m.trim() != m {
                return Err(format!(
                    "reasoning.{name} must be 1 to {MAX_MARKER_BYTES} bytes without surrounding whitespace, got {:?}",
                    m.chars().take(80).collect::<String>()
                ));
            }
        }
        if close.starts_with(open) {
            return Err("reasoning.open and reasoning.close must differ, and close must not start with open".into());
        }
        Ok(Self { open: open.into(), close: close.into() })
    }

    /// What a template with thinking disabled writes after the assistant's header: an empty
    /// thought, after which the model answers.
    pub fn empty_thought(&self) -> String {
        format!("{}\n\n{}\n\n", self.open, self.close)
    }

    /// The text that closes a thought cut short (a budget), ending where an answer starts.
    pub fn closing(&self) -> String {
        format!("\n{}\n\n", self.close)
    }
}

/// Where the model is in its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Nothing written yet: a thought may open (after whitespace), or the answer start.
    Start,
    /// Inside a thought.
    Thought,
    /// Just after a thought's closing marker: whitespace, then the answer.
    Closed,
    /// The answer.
    Answer,
}

impl Phase {
    /// The phase a prompt leaves the model in, from the prompt's last text: inside a thought
    /// when it ends with the opening marker, past one when it ends with the closing marker.
    pub fn after_prompt(syntax: &ReasoningSyntax, prompt_tail: &str) -> Self {
        let t = prompt_tail.trim_end();
        if t.ends_with(&syntax.open) {
            Self::Thought
        } else if t.ends_with(&syntax.close) {
            Self::Closed
        } else {
            Self::Start
        }
    }
}

/// One push's output: answer text and thought text.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub answer: String,
    pub thought: String,
}

/// Splits streamed output into thought and answer (see the module note).
#[derive(Debug)]
pub struct ReasoningStream {
    syntax: ReasoningSyntax,
    phase: Phase,
    /// Text not yet released: what could still become a marker, and a thought's trailing
    /// whitespace (dropped if the closing marker follows it).
    held: String,
    /// Whether the thought has shown text (its leading whitespace is dropped).
    thought_started: bool,
}

impl ReasoningStream {
    pub fn new(syntax: ReasoningSyntax, phase: Phase) -> Self {
        Self { syntax, phase, held: String::new(), thought_started: false }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn syntax(&self) -> &ReasoningSyntax {
        &self.syntax
    }

    /// Adds `delta` (the output's next text) and returns what can be released of it.
    pub fn push(&mut self, delta: &str) -> Split {
        let mut out = Split::default();
        self.held.push_str(delta);
        loop {
            match self.phase {
                Phase::Start => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(self.syntax.open.as_str()) {
                        self.held = rest.to_string();
                        self.phase = Phase::Thought;
                        continue;
                    }
                    if self.syntax.open.starts_with(t) {
                        break;
                    }
                    self.phase = Phase::Answer;
                }
                Phase::Thought => {
                    if !self.thought_started {
                        let t = self.held.trim_start();
                        if t.is_empty() {
                            // The thought's leading whitespace is dropped.
                            self.held.clear();
                            break;
                        }
                        self.held = t.to_string();
                        self.thought_started = true;
                    }
                    if let Some(at) = self.held.find(self.syntax.close.as_str()) {
                        out.thought.push_str(self.held[..at].trim_end());
                        self.held.drain(..at + self.syntax.close.len());
                        self.phase = Phase::Closed;
                        continue;
                    }
                    let keep = partial_suffix(&self.held, &self.syntax.close);
                    let release = self.held[..self.held.len() - keep].trim_end().len();
                    out.thought.push_str(&self.held[..release]);
                    self.held.drain(..release);
                    break;
                }
                Phase::Closed => {
                    let t = self.held.trim_start();
                    if t.is_empty() {
                        self.held.clear();
                        break;
                    }
                    self.held = t.to_string();
                    self.phase = Phase::Answer;
                }
                Phase::Answer => {
                    out.answer.push_str(&self.held);
                    self.held.clear();
                    break;
                }
            }
        }
        out
    }

    /// The output ended: releases what was held (a thought's unfinished text stays thought).
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.phase {
            Phase::Start | Phase::Answer => Split { answer: held, thought: String::new() },
            Phase::Thought => Split { answer: String::new(), thought: held.trim_end().to_string() },
            Phase::Closed => Split::default(),
        }
    }
}

/// Bytes at the end of `text` that are a proper prefix of `marker`.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1)).rev().find(|&n| marker.is_char_boundary(n) && text.ends_with(&marker[..n])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(phase: Phase, pieces: &[&str]) -> (String, String) {
        let mut s = ReasoningStream::new(ReasoningSyntax::think(), phase);
        let (mut answer, mut thought) = (String::new(), String::new());
        for p in pieces {
            let o = s.push(p);
            answer.push_str(&o.answer);
            thought.push_str(&o.thought);
        }
        let o = s.finish();
        answer.push_str(&o.answer);
        thought.push_str(&o.thought);
        (thought, answer)
    }

    #[test]
    fn splits_a_thought_from_the_answer_across_token_boundaries() {
        let pieces = ["<th", "ink>", "\n", "Two", " plus", " two.", "\n", "</", "think", ">", "\n\n", "Four", "."];
        assert_eq!(run(Phase::Start, &pieces), ("Two plus two.".into(), "Four.".into()));
        // Every split point of the same text gives the same result.
        let text: String = pieces.concat();
        for cut in 1..text.len() {
            assert_eq!(run(Phase::Start, &[&text[..cut], &text[cut..]]), ("Two plus two.".into(), "Four.".into()), "{cut}");
        }
    }

    #[test]
    fn an_answer_without_a_thought_passes_through() {
        assert_eq!(run(Phase::Start, &["Hello", " there"]), (String::new(), "Hello there".into()));
        // Text that only starts like the marker is released once it is not the marker.
        assert_eq!(run(Phase::Start, &["<t", "able>"]), (String::new(), "<table>".into()));
        // A marker later in the answer is answer text.
        assert_eq!(run(Phase::Start, &["a <think> b"]), (String::new(), "a <think> b".into()));
    }

    #[test]
    fn prompts_that_open_or_close_the_thought() {
        let think = ReasoningSyntax::think();
        assert_eq!(Phase::after_prompt(&think, "<|im_start|>assistant\n<think>\n"), Phase::Thought);
        assert_eq!(Phase::after_prompt(&think, "assistant\n<think>\n\n</think>\n\n"), Phase::Closed);
        assert_eq!(Phase::after_prompt(&think, "<|im_start|>assistant\n"), Phase::Start);
        assert_eq!(run(Phase::Thought, &["step\n", "</think>\n\nok"]), ("step".into(), "ok".into()));
        assert_eq!(run(Phase::Closed, &["\n", "\nanswer"]), (String::new(), "answer".into()));
    }

    #[test]
    fn a_thought_cut_off_keeps_its_text_and_inner_whitespace() {
        assert_eq!(run(Phase::Start, &["<think>\na\n\nb  ", "\n</thi"]), ("a\n\nb  \n</thi".trim_end().into(), String::new()));
        assert_eq!(run(Phase::Start, &["<think>\na \n", "b"]), ("a \nb".into(), String::new()));
        assert_eq!(run(Phase::Start, &["  "]), (String::new(), "  ".into()));
    }

    #[test]
    fn manifest_markers_are_checked() {
        assert!(ReasoningSyntax::new("<reason>", "</reason>").is_ok());
        assert!(ReasoningSyntax::new("", "</x>").is_err());
        assert!(ReasoningSyntax::new(" <x>", "</x>").is_err());
        assert!(ReasoningSyntax::new("<x>", "<x>").is_err());
        assert!(ReasoningSyntax::new("<x>", "<x>y").is_err());
        assert!(ReasoningSyntax::new(&"x".repeat(65), "</x>").is_err());
    }
}
