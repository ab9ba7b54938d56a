//! Streaming detokenization.
//!
//! Design (text-generation-inference's `decode_token`): keep the generated ids from
//! `prefix_offset` on. Each step decodes two small windows, `ids[prefix_offset..read_offset]`
//! (text already emitted, re-decoded for context) and `ids[prefix_offset..]`; the new text is the
//! difference. Decoding with one token of context keeps tokenizer-specific joins right (e.g. a
//! SentencePiece leading "▁" is stripped only at the very start). When the new text ends in
//! U+FFFD the last token(s) hold an incomplete UTF-8 character: nothing is emitted and the window
//! grows until the character completes. After emitting, the window slides forward and the ids
//! before `prefix_offset` are dropped, so each step costs O(window), not O(sequence).
//!
//! Byte-level decoders map each token to bytes independently, so the concatenation of all chunks
//! plus [`IncrementalDecoder::flush`] equals decoding the whole sequence at once.

use super::Tokenizer;

/// Once this many tokens are withheld and the text still ends in U+FFFD, the bytes are not a
/// character in the making (a UTF-8 sequence is at most 4 bytes) but genuinely invalid: emit
/// them (lossily) so the window cannot grow without bound.
const MAX_PENDING_TOKENS: usize = 8;

/// Turns generated tokens into text one token at a time.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    /// Generated ids from `prefix_offset` on (older ones are dropped).
    ids: Vec<u32>,
    /// Start of the context window, relative to `ids` (always 0 after compaction).
    prefix_offset: usize,
    /// End of the text already emitted, relative to `ids`.
    read_offset: usize,
    skip_special_tokens: bool,
}

impl Default for IncrementalDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl IncrementalDecoder {
    /// A decoder that skips special tokens (EOS, `<|im_end|>`, ...) in its output.
    pub fn new() -> Self {
        Self::with_skip_special_tokens(true)
    }

    /// A decoder that keeps (`false`) or drops (`true`) special tokens' text.
    pub fn with_skip_special_tokens(skip_special_tokens: bool) -> Self {
        Self { ids: Vec::new(), prefix_offset: 0, read_offset: 0, skip_special_tokens }
    }

    /// Feed the next generated token; returns the newly completed text (possibly ""). Never
    /// returns a partial UTF-8 character: text is withheld while its tail decodes to U+FFFD.
    pub fn push(&mut self, tok: &Tokenizer, token: u32) -> Result<String, String> {
        self.ids.push(token);
        let prefix_text = tok.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special_tokens)?;
        let new_text = tok.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        let pending = self.ids.len() - self.read_offset;
        let complete = !new_text.ends_with('\u{FFFD}');
        if new_text.len() > prefix_text.len() && (complete || pending >= MAX_PENDING_TOKENS) {
            let chunk = text_delta(&prefix_text, &new_text);
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            self.compact();
            Ok(chunk)
        } else {
            Ok(String::new())
        }
    }

    /// Whatever is still withheld at the end of generation (lossy: an incomplete character
    /// becomes U+FFFD). Resets the decoder.
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String, String> {
        let out = if self.read_offset < self.ids.len() {
            let prefix_text = tok.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special_tokens)?;
            let new_text = tok.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
            text_delta(&prefix_text, &new_text)
        } else {
            String::new()
        };
        self.ids.clear();
        self.prefix_offset = 0;
        self.read_offset = 0;
        Ok(out)
    }

    /// Forget everything (start of a new generation).
    pub fn reset(&mut self) {
        self.ids.clear();
        self.prefix_offset = 0;
        self.read_offset = 0;
    }

    /// Number of tokens currently kept (context window + withheld tokens).
    pub fn window_len(&self) -> usize {
        self.ids.len()
    }

    fn compact(&mut self) {
        if self.prefix_offset > 0 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
    }
}

/// `new` minus its prefix `old`. If `old` is not a prefix (a decoder that rewrites earlier text),
/// fall back to the part after the longest common prefix.
fn text_delta(old: &str, new: &str) -> String {
    if let Some(rest) = new.strip_prefix(old) {
        return rest.to_owned();
    }
    let common = old
        .char_indices()
        .zip(new.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| old.len().min(new.len()));
    let mut cut = common.min(new.len());
    while !new.is_char_boundary(cut) {
        cut -= 1;
    }
    new[cut..].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::test_support::{check_incremental, smollm2, synthetic_gguf};

    #[test]
    fn incremental_decoder_synthetic() {
        let tok = Tokenizer::from_gguf(&synthetic_gguf("gpt-2")).unwrap();
        // Every non-ASCII char here is several single-byte tokens.
        let ids = tok.encode("the café naïve 日本 🎉 end<|im_end|>", false).unwrap();
        let chunks = check_incremental(&tok, &ids, true);
        check_incremental(&tok, &ids, false);
        // The 4-byte emoji arrives as one chunk, withheld until its last byte.
        assert!(chunks.iter().any(|c| c == "🎉"), "{chunks:?}");
        assert!(chunks.iter().filter(|c| c.is_empty()).count() >= 3);
        // flush() hands out an incomplete character lossily.
        let mut dec = IncrementalDecoder::new();
        let partial = tok.encode("日", false).unwrap();
        let mut out = String::new();
        for &id in &partial[..2] {
            out += &dec.push(&tok, id).unwrap();
        }
        assert_eq!(out, "");
        assert_eq!(dec.flush(&tok).unwrap(), "\u{FFFD}");
    }

    #[test]
    fn smollm2_incremental_decoder() {
        let Some(tok) = smollm2() else { return };
        for text in ["café naïve 日本 🎉", "Ünïcödé façade — “quotes” … ½ ² Ω мир 🎉🎉 done"] {
            let ids = tok.encode(text, false).unwrap();
            let chunks = check_incremental(&tok, &ids, true);
            assert_eq!(chunks.concat(), text);
        }
    }
}
