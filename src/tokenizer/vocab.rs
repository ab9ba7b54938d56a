//! The bytes each token id stands for, as a grammar engine needs them.
//!
//! Constrained decoding walks a trie of token byte strings, so it needs every token's exact
//! bytes, not its text: a byte-level BPE token can be half a UTF-8 character, and decoding
//! one token alone turns that half into U+FFFD. The bytes come from the tokenizer's own model
//! (our `tokenizers` pipeline, whether it was read from `tokenizer.json` or rebuilt from GGUF
//! metadata), serialized and read by llguidance's `token_bytes_from_tokenizer_json`: it undoes
//! the byte-level character map and SentencePiece byte fallback / `▁` spaces, and marks special
//! tokens with a leading 0xFF byte so no grammar literal can produce them by accident.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::Tokenizer;

impl Tokenizer {
    /// One byte string per token id (`vocab_size()` of them; ids the vocabulary skips are
    /// empty). Special tokens start with 0xFF. Fails for a tokenizer whose decoder is neither
    /// byte-level nor byte-fallback (no exact bytes to be had).
    pub fn token_bytes(&self) -> Result<Vec<Vec<u8>>, String> {
        let json = self.inner.to_string(false).map_err(|e| format!("tokenizer: cannot serialize the vocabulary: {e}"))?;
        let value: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| format!("tokenizer: cannot read the serialized vocabulary: {e}"))?;
        // The reader asserts on malformed byte-fallback entries (`<0xZZ>`) rather than failing.
        let mut bytes = catch_unwind(AssertUnwindSafe(|| llguidance::token_bytes_from_tokenizer_json(&value)))
            .map_err(|p| format!("tokenizer: unusable vocabulary: {}", crate::error::panic_message(&*p)))?
            .map_err(|e| format!("tokenizer: cannot map tokens to bytes for constrained decoding: {e}"))?;
        bytes.resize(bytes.len().max(self.vocab_size), Vec::new());
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use crate::tokenizer::test_support::smollm2;
    use crate::tokenizer::Tokenizer;
    use std::path::PathBuf;

    fn check_round_trip(tok: &Tokenizer, text: &str) {
        let bytes = tok.token_bytes().unwrap();
        let ids = tok.encode_text(text, false, false).unwrap();
        let joined: Vec<u8> = ids.iter().flat_map(|&i| bytes[i as usize].clone()).collect();
        assert_eq!(String::from_utf8(joined).unwrap(), text);
    }

    #[test]
    fn byte_level_tokens_concatenate_to_the_text() {
        let tok = Tokenizer::from_dir(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("__test__/fixtures/qwen3-tiny")).unwrap();
        check_round_trip(&tok, "Hello, wörld! 你好 {\"a\": [1, 2]}\n\t");
        let bytes = tok.token_bytes().unwrap();
        assert_eq!(bytes.len(), tok.vocab_size());
        let im_end = tok.token_id("<|im_end|>").unwrap() as usize;
        assert_eq!(bytes[im_end], b"\xff<|im_end|>");
    }

    #[test]
    fn gguf_vocabulary_maps_to_bytes() {
        let Some(tok) = smollm2() else { return };
        check_round_trip(&tok, "Hello, wörld! {\"name\": \"Ada\"}");
    }
}
