//! Helpers shared by the tokenizer's unit tests (`mod.rs`, `gguf.rs`, `detok.rs`): the optional
//! SmolLM2 GGUF, synthetic GGUF vocabularies, and a streaming-decode check.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::quantized::gguf_file;

use super::{IncrementalDecoder, Tokenizer};

// ----- locating test assets (all optional: tests skip with a note when absent) -----

fn smollm2_path() -> Option<PathBuf> {
    let p = match std::env::var_os("EXPERT_RUNTIME_SMOLLM2") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/expert-runtime/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    if p.is_file() {
        Some(p)
    } else {
        eprintln!("SKIP: SmolLM2 GGUF not found at {} (set EXPERT_RUNTIME_SMOLLM2 or run the asset fetch)", p.display());
        None
    }
}

pub(super) fn smollm2() -> Option<Tokenizer> {
    let path = smollm2_path()?;
    let mut f = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    Some(Tokenizer::from_gguf(&content.metadata).unwrap())
}

/// Decodes `ids` one token at a time; checks the chunks are clean and add up to the full decode.
pub(super) fn check_incremental(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> Vec<String> {
    let full = tok.decode(ids, skip_special).unwrap();
    let mut dec = IncrementalDecoder::with_skip_special_tokens(skip_special);
    let mut chunks = Vec::new();
    for &id in ids {
        let c = dec.push(tok, id).unwrap();
        assert!(!c.contains('\u{FFFD}'), "chunk {c:?} contains U+FFFD");
        assert!(dec.window_len() <= 8, "window grew to {}", dec.window_len());
        chunks.push(c);
    }
    let tail = dec.flush(tok).unwrap();
    assert_eq!(tail, "", "nothing should be withheld after complete text");
    assert_eq!(chunks.concat(), full);
    chunks
}

// ----- synthetic GGUF -----

/// GPT-2's byte → unicode map (printable bytes stay, others shift to U+0100+).
fn byte_level_alphabet() -> Vec<String> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![String::new(); 256];
    for (b, c) in bs.iter().zip(cs) {
        out[*b as usize] = char::from_u32(c).unwrap().to_string();
    }
    out
}

/// `tokenizer.ggml.model`, `tokenizer.ggml.tokens` and `tokenizer.ggml.token_type`.
pub(super) fn vocab_metadata(model: &str, tokens: Vec<String>, types: Vec<i32>) -> HashMap<String, gguf_file::Value> {
    use gguf_file::Value as V;
    let mut md = HashMap::new();
    md.insert("tokenizer.ggml.model".into(), V::String(model.into()));
    md.insert("tokenizer.ggml.tokens".into(), V::Array(tokens.into_iter().map(V::String).collect()));
    md.insert("tokenizer.ggml.token_type".into(), V::Array(types.into_iter().map(V::I32).collect()));
    md
}

pub(super) fn synthetic_gguf(pre: &str) -> HashMap<String, gguf_file::Value> {
    use gguf_file::Value as V;
    let mut tokens = byte_level_alphabet();
    let mut types = vec![1i32; 256];
    let merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "1 2"];
    for m in &merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    for special in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(special.into());
        types.push(3);
    }
    tokens.push("<think>".into());
    types.push(4);
    let n = tokens.len();
    let mut md = vocab_metadata("gpt2", tokens, types);
    md.insert("tokenizer.ggml.pre".into(), V::String(pre.into()));
    md.insert("tokenizer.ggml.merges".into(), V::Array(merges.iter().map(|m| V::String((*m).into())).collect()));
    md.insert("tokenizer.ggml.bos_token_id".into(), V::U32(n as u32 - 3));
    md.insert("tokenizer.ggml.eos_token_id".into(), V::U32(n as u32 - 2));
    md.insert("tokenizer.ggml.add_bos_token".into(), V::Bool(true));
    md.insert(
        "tokenizer.chat_template".into(),
        V::String("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}".into()),
    );
    md
}
