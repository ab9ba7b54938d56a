//! Building a `tokenizers::Tokenizer` from GGUF metadata (`tokenizer.ggml.*`).
//!
//! Design: we do not re-implement llama.cpp's tokenizer; we translate its vocabulary into the
//! equivalent HF `tokenizers` pipeline so that encode/decode share one well-tested engine:
//!
//! * `tokenizer.ggml.model == "gpt2"` (byte-level BPE): BPE model over `tokens`/`merges`,
//!   pre-tokenizer = one `Split(regex, Isolated)` per regex that llama.cpp's
//!   `llm_tokenizer_bpe` uses for `tokenizer.ggml.pre` (llama.cpp applies its regex list
//!   sequentially, each one splitting the pieces produced by the previous one — exactly what a
//!   `Sequence` of `Split`s does), followed by `ByteLevel(add_prefix_space=false,
//!   use_regex=false)`; decoder = `ByteLevel` (no spaces are inserted between tokens).
//!   Where llama.cpp only carries an adapted copy of the HF regex (std::regex lacks Unicode
//!   classes) we use the original HF regex, which Oniguruma supports.
//!   `ignore_merges` and the default for `add_bos` follow llama.cpp's per-`pre` settings.
//! * `tokenizer.ggml.model == "llama"` (SentencePiece BPE): BPE with merges derived from the
//!   token scores (the same construction HF's `SpmConverter` uses), `byte_fallback` over the
//!   `<0xXX>` tokens, normalizer `Prepend("▁")` (when `add_space_prefix`) + `Replace(" ", "▁")`,
//!   decoder `Replace("▁", " ")`, `ByteFallback`, `Fuse`, `Strip(1 leading space)`.
//!
//! Token types (llama.cpp `llama_token_type`): 3 = control → special added token (matched in
//! text, skipped by `decode(.., skip_special_tokens=true)`), 4 = user-defined → non-special added
//! token, 2 = unknown → special added token. BOS/EOS are not inserted by the `tokenizers`
//! pipeline; [`GgufTokenizer::add_bos`]/[`GgufTokenizer::add_eos`] tell the caller to do it.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::gguf_meta::{get_bool, get_f32_array, get_int_array, get_str, get_str_array, get_token_id, Metadata};

/// llama.cpp token types (`tokenizer.ggml.token_type`).
const TOKEN_TYPE_UNKNOWN: i64 = 2;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Everything the GGUF metadata tells us about the tokenizer.
pub struct GgufTokenizer {
    pub tokenizer: tokenizers::Tokenizer,
    /// Number of entries in `tokenizer.ggml.tokens`.
    pub vocab_size: usize,
    pub bos_id: Option<u32>,
    /// `eos_token_id`, then `eot_token_id` / `eom_token_id` when present (deduplicated).
    pub eos_ids: Vec<u32>,
    /// Insert BOS when encoding with special tokens (`tokenizer.ggml.add_bos_token`, else the
    /// llama.cpp default for this model / pre-tokenizer).
    pub add_bos: bool,
    pub add_eos: bool,
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer regexes (llama.cpp src/llama-vocab.cpp, `llm_tokenizer_bpe` constructor).
// ---------------------------------------------------------------------------------------------

/// GPT-2's regex, as llama.cpp lists it (without the trailing `|\s+`: text no alternative
/// matches becomes its own piece anyway, so the result is the same).
const RE_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3 (original tokenizer.json form).
const RE_LLAMA3: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2 / Qwen3 (original tokenizer.json form): single digits.
const RE_QWEN2: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5: marks join letters.
const RE_QWEN35: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o / Llama 4 (original tokenizer.json form).
const RE_GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Mistral Tekken (original tokenizer.json form).
const RE_TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_SEED_CODER: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const RE_MINICPM5: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_DEEPSEEK3_MAIN: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

/// How llama.cpp handles one `tokenizer.ggml.pre` value.
#[derive(Debug, Clone, PartialEq)]
pub struct PreTokenizerSpec {
    /// Regexes applied one after the other (each splits the pieces of the previous one).
    pub regexes: Vec<&'static str>,
    /// Whole pre-tokenized words that are in the vocabulary are emitted without merging.
    pub ignore_merges: bool,
    /// llama.cpp's default for `add_bos` (overridden by `tokenizer.ggml.add_bos_token`).
    pub add_bos: bool,
    /// llama.cpp clears the BOS id for this pre-tokenizer (ChatGLM).
    pub no_bos: bool,
}

/// The `tokenizer.ggml.pre` values we support, grouped as llama.cpp groups them.
pub const SUPPORTED_PRE: &[&str] = &[
    "default",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "dbrx",
    "smaug-bpe",
    "chatglm-bpe",
    "glm4",
    "deepseek-coder",
    "deepseek-v3",
    "hunyuan-dense",
    "joyai-llm",
    "falcon",
    "starcoder",
    "refact",
    "command-r",
    "smollm",
    "codeshell",
    "exaone",
    "minerva-7b",
    "mellum2",
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "gigachat",
    "jina-v2-es",
    "jina-v2-de",
    "a.x-4.0",
    "mellum",
    "modern-bert",
    "jina-v1-en",
    "jina-v2-code",
    "roberta-bpe",
    "mpt",
    "olmo",
    "jais",
    "trillion",
    "granite-docling",
    "exaone4",
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "f2llmv2",
    "stablelm2",
    "megrez",
    "hunyuan",
    "solar-open",
    "grok-2",
    "qwen35",
    "poro-chat",
    "bloom",
    "gpt3-finnish",
    "tekken",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
    "minimax-m2",
    "seed-coder",
    "bailingmoe",
    "bailingmoe2",
    "llada-moe",
    "minicpm5",
];

/// Maps a `tokenizer.ggml.pre` value (empty = missing) to llama.cpp's regex list and flags.
pub fn pre_tokenizer_spec(pre: &str) -> Result<PreTokenizerSpec, String> {
    let spec = |regexes: Vec<&'static str>| PreTokenizerSpec { regexes, ignore_merges: false, add_bos: false, no_bos: false };
    let s = match pre {
        // llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT (also used when the key is missing).
        "" | "default" => spec(vec![r"[\p{P}\$\+<=>\^~\|]+", RE_GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" | "jina-v5-nano" => {
            PreTokenizerSpec { ignore_merges: true, add_bos: true, ..spec(vec![RE_LLAMA3]) }
        }
        "dbrx" | "smaug-bpe" => spec(vec![RE_LLAMA3]),
        "chatglm-bpe" | "glm4" => PreTokenizerSpec { no_bos: true, ..spec(vec![RE_LLAMA3]) },
        "deepseek-coder" => spec(vec!["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"]),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" => spec(vec![r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", RE_DEEPSEEK3_MAIN]),
        "falcon" => spec(vec![r"[\p{P}\$\+<=>\^~\|`]+", RE_GPT2, r"[0-9][0-9][0-9]"]),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            spec(vec![r"\p{N}", RE_GPT2])
        }
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
        | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" | "trillion"
        | "granite-docling" | "exaone4" => spec(vec![RE_GPT2]),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "megrez" | "hunyuan" | "solar-open" | "grok-2" => {
            spec(vec![RE_QWEN2])
        }
        "qwen35" => spec(vec![RE_QWEN35]),
        "poro-chat" | "bloom" | "gpt3-finnish" => spec(vec![r" ?[^(\s|.,!?…。，、।۔،)]+"]),
        "tekken" => PreTokenizerSpec { ignore_merges: true, add_bos: true, ..spec(vec![RE_TEKKEN]) },
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => spec(vec![RE_GPT4O]),
        "seed-coder" => spec(vec![RE_SEED_CODER]),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => spec(vec![RE_BAILINGMOE]),
        "minicpm5" => PreTokenizerSpec { ignore_merges: true, ..spec(vec![r"\p{N}{1,3}", RE_MINICPM5]) },
        other => {
            return Err(format!(
                "unsupported GGUF pre-tokenizer 'tokenizer.ggml.pre' = '{other}' (supported: {})",
                SUPPORTED_PRE.join(", ")
            ))
        }
    };
    Ok(s)
}

// ---------------------------------------------------------------------------------------------
// Construction
// ---------------------------------------------------------------------------------------------

/// Builds the tokenizer described by GGUF metadata.
pub fn load(md: &Metadata) -> Result<GgufTokenizer, String> {
    let model = get_str(md, "tokenizer.ggml.model")?
        .ok_or("GGUF metadata has no 'tokenizer.ggml.model' (the file carries no tokenizer)")?;
    let tokens = get_str_array(md, "tokenizer.ggml.tokens")?.ok_or("GGUF metadata has no 'tokenizer.ggml.tokens'")?;
    if tokens.is_empty() {
        return Err("GGUF metadata 'tokenizer.ggml.tokens' is empty".into());
    }
    let n = tokens.len();
    let types = match get_int_array(md, "tokenizer.ggml.token_type")? {
        Some(t) if t.len() != n => {
            return Err(format!(
                "GGUF metadata 'tokenizer.ggml.token_type' has {} entries but 'tokenizer.ggml.tokens' has {n}",
                t.len()
            ))
        }
        Some(t) => t,
        None => vec![1; n],
    };

    let mut bos_id = get_token_id(md, "tokenizer.ggml.bos_token_id", n)?;
    let eos_id = get_token_id(md, "tokenizer.ggml.eos_token_id", n)?;
    let eos_ids = end_of_generation_ids(md, n)?;

    let (mut tokenizer, default_add_bos) = match model {
        "gpt2" => {
            let pre = get_str(md, "tokenizer.ggml.pre")?.unwrap_or("");
            let spec = pre_tokenizer_spec(pre)?;
            if spec.no_bos {
                bos_id = None;
            }
            (build_byte_level_bpe(md, &tokens, &spec)?, spec.add_bos)
        }
        "llama" => (build_spm(md, &tokens, &types)?, true),
        other => {
            return Err(format!(
                "unsupported GGUF tokenizer model 'tokenizer.ggml.model' = '{other}' (supported: 'gpt2', 'llama')"
            ))
        }
    };

    add_vocab_tokens(&mut tokenizer, &tokens, &types, bos_id, &eos_ids)?;

    let add_bos = get_bool(md, "tokenizer.ggml.add_bos_token")?.unwrap_or(default_add_bos) && bos_id.is_some();
    let add_eos = get_bool(md, "tokenizer.ggml.add_eos_token")?.unwrap_or(false) && eos_id.is_some();
    let chat_template = get_str(md, "tokenizer.chat_template")?.map(str::to_owned);

    Ok(GgufTokenizer {
        tokenizer,
        vocab_size: n,
        bos_token: bos_id.map(|id| tokens[id as usize].to_owned()),
        eos_token: eos_id.map(|id| tokens[id as usize].to_owned()),
        bos_id,
        eos_ids,
        add_bos,
        add_eos,
        chat_template,
    })
}

/// `eos_token_id`, then `eot_token_id` / `eom_token_id` when present, without repeats.
fn end_of_generation_ids(md: &Metadata, n: usize) -> Result<Vec<u32>, String> {
    let mut eos_ids = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = get_token_id(md, key, n)? {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
    }
    Ok(eos_ids)
}

/// Control / unknown tokens become special added tokens, user-defined ones plain added
/// tokens: both are matched verbatim in the input before the model runs (llama.cpp's
/// `tokenizer_st_partition` with parse_special=true).
fn add_vocab_tokens(
    tokenizer: &mut tokenizers::Tokenizer,
    tokens: &[&str],
    types: &[i64],
    bos_id: Option<u32>,
    eos_ids: &[u32],
) -> Result<(), String> {
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (&tok, &ty) in tokens.iter().zip(types.iter()) {
        if tok.is_empty() {
            continue;
        }
        match ty {
            TOKEN_TYPE_CONTROL | TOKEN_TYPE_UNKNOWN => special.push(AddedToken::from(tok, true).normalized(false)),
            TOKEN_TYPE_USER_DEFINED => user.push(AddedToken::from(tok, false).normalized(false)),
            _ => {}
        }
    }
    // BOS/EOS are special even when a converter forgot to mark them as control tokens.
    for id in bos_id.iter().chain(eos_ids.iter()) {
        let tok = tokens[*id as usize];
        if !tok.is_empty() && !special.iter().any(|t| t.content == tok) {
            special.push(AddedToken::from(tok, true).normalized(false));
        }
    }
    tokenizer.add_special_tokens(special).map_err(|e| format!("GGUF tokenizer: adding control tokens failed: {e}"))?;
    tokenizer.add_tokens(user).map_err(|e| format!("GGUF tokenizer: adding user-defined tokens failed: {e}"))?;
    Ok(())
}

/// token → id, last occurrence wins (as in llama.cpp's `token_to_id`).
fn vocab_map(tokens: &[&str]) -> Vocab {
    let mut vocab = Vocab::default();
    vocab.reserve(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert((*t).to_owned(), i as u32);
    }
    vocab
}

fn build_byte_level_bpe(md: &Metadata, tokens: &[&str], spec: &PreTokenizerSpec) -> Result<tokenizers::Tokenizer, String> {
    let merges_raw = get_str_array(md, "tokenizer.ggml.merges")?
        .ok_or("GGUF metadata has no 'tokenizer.ggml.merges' (required for tokenizer model 'gpt2')")?;
    let vocab = vocab_map(tokens);
    let mut merges: Merges = Vec::with_capacity(merges_raw.len());
    for m in merges_raw {
        // llama.cpp: split at the first space after the first byte.
        let Some(pos) = m.as_bytes().iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
            continue;
        };
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        // A merge whose halves are not tokens can never fire; `tokenizers` rejects it, so drop it.
        if vocab.contains_key(a) && vocab.contains_key(b) {
            merges.push((a.to_owned(), b.to_owned()));
        }
    }
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(spec.ignore_merges).build().map_err(|e| {
        format!("GGUF tokenizer: building the BPE model from 'tokenizer.ggml.tokens'/'tokenizer.ggml.merges' failed: {e}")
    })?;

    let mut pre: Vec<PreTokenizerWrapper> = Vec::with_capacity(spec.regexes.len() + 1);
    for re in &spec.regexes {
        let split = Split::new(SplitPattern::Regex((*re).to_owned()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| format!("GGUF tokenizer: compiling pre-tokenizer regex {re:?} failed: {e}"))?;
        pre.push(PreTokenizerWrapper::Split(split));
    }
    pre.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)));

    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(PreTokenizerSequence::new(pre))));
    tk.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::new(false, true, false))));
    Ok(tk)
}

/// Longest piece, in bytes, that merges build. Finding a piece's merges looks up both halves at
/// every split, which costs the square of its length: a crafted 60 KB piece took 5 s to load
/// (fuzz build), a few MB would take hours. The pieces of real vocabularies are tens of bytes; a
/// longer piece still decodes, it only never comes out of encoding.
pub const MAX_MERGED_PIECE_BYTES: usize = 1024;

/// Most memory the derived merges may take: a crafted vocabulary in which every prefix and suffix
/// of each piece is a piece too yields about as many merges per piece as it has bytes. Real
/// vocabularies need a few tens of MB.
pub const MAX_SPM_MERGE_BYTES: usize = 1 << 30;

/// (score, merged id, left id, right id, split): one way to build a normal token from two tokens.
type MergeCandidate = (f32, u32, u32, u32, usize);

/// The merges of a SentencePiece vocabulary, ranked (see [`build_spm`]).
fn spm_merges(tokens: &[&str], types: &[i64], scores: &[f32], vocab: &Vocab) -> Result<Merges, String> {
    let mut cands: Vec<MergeCandidate> = Vec::new();
    let mut bytes = 0usize;
    for (id, &tok) in tokens.iter().enumerate() {
        if types[id] != 1 || tok.len() > MAX_MERGED_PIECE_BYTES || vocab.get(tok) != Some(&(id as u32)) {
            continue;
        }
        for (split, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(split);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                // The candidate, then the merge's two strings.
                bytes += std::mem::size_of::<MergeCandidate>() + 2 * std::mem::size_of::<String>() + tok.len();
                if bytes > MAX_SPM_MERGE_BYTES {
                    return Err(format!(
                        "GGUF tokenizer: the merges derived from 'tokenizer.ggml.tokens' would take more than {MAX_SPM_MERGE_BYTES} bytes"
                    ));
                }
                cands.push((scores[id], id as u32, li, ri, split));
            }
        }
    }
    // Highest score first; for one piece, order by (left id, right id) like HF; stable otherwise.
    cands.sort_by(|a, b| {
        b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)).then(a.3.cmp(&b.3))
    });
    Ok(cands
        .iter()
        .map(|&(_, id, _, _, split)| {
            let t = tokens[id as usize];
            (t[..split].to_owned(), t[split..].to_owned())
        })
        .collect())
}

/// SentencePiece (BPE-type) vocabulary: merges are derived from the scores the way HF's
/// `SentencePieceExtractor` does (every split of a piece into two in-vocabulary pieces is a merge,
/// ranked by the merged piece's score, highest first).
fn build_spm(md: &Metadata, tokens: &[&str], types: &[i64]) -> Result<tokenizers::Tokenizer, String> {
    let n = tokens.len();
    let scores = match get_f32_array(md, "tokenizer.ggml.scores")? {
        Some(s) if s.len() != n => {
            return Err(format!(
                "GGUF metadata 'tokenizer.ggml.scores' has {} entries but 'tokenizer.ggml.tokens' has {n}",
                s.len()
            ))
        }
        Some(s) => s,
        None => return Err("GGUF metadata has no 'tokenizer.ggml.scores' (required for tokenizer model 'llama')".into()),
    };
    let vocab = vocab_map(tokens);
    let merges = spm_merges(tokens, types, &scores, &vocab)?;

    let unk = get_token_id(md, "tokenizer.ggml.unknown_token_id", n)?
        .or_else(|| vocab.get("<unk>").copied())
        .map(|id| tokens[id as usize].to_owned());
    let mut builder = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let bpe = builder
        .build()
        .map_err(|e| format!("GGUF tokenizer: building the SentencePiece BPE model from 'tokenizer.ggml.tokens'/'tokenizer.ggml.scores' failed: {e}"))?;

    let add_space_prefix = get_bool(md, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
    let replace = |a: &str, b: &str| Replace::new(a, b).map_err(|e| format!("GGUF tokenizer: {e}"));
    let mut norms = Vec::new();
    if add_space_prefix {
        norms.push(NormalizerWrapper::Prepend(Prepend::new("▁".into())));
    }
    norms.push(NormalizerWrapper::Replace(replace(" ", "▁")?));
    let mut decs = vec![
        DecoderWrapper::Replace(replace("▁", " ")?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_space_prefix {
        decs.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }

    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_normalizer(Some(NormalizerWrapper::Sequence(NormalizerSequence::new(norms))))
        .map_err(|e| format!("GGUF tokenizer: {e}"))?;
    tk.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(decs))));
    Ok(tk)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_core::quantized::gguf_file;

    use crate::tokenizer::test_support::{check_incremental, synthetic_gguf, vocab_metadata};
    use crate::tokenizer::{gguf, ChatMessage, Tokenizer};

    #[test]
    fn synthetic_gguf_byte_level_bpe() {
        let tok = Tokenizer::from_gguf(&synthetic_gguf("gpt-2")).unwrap();
        assert_eq!(tok.vocab_size(), 256 + 5 + 4);
        let the = tok.token_id("Ġthe").unwrap();
        let bos = tok.token_id("<|im_start|>").unwrap();
        let eos = tok.token_id("<|im_end|>").unwrap();
        assert_eq!(tok.bos_token_id(), Some(bos));
        assert_eq!(tok.eos_token_ids(), vec![eos]);
        // BPE merges + GPT-2 split + special tokens in text + BOS only with add_special_tokens.
        let ids = tok.encode("a the<|im_end|><think>", true).unwrap();
        assert_eq!(ids, vec![bos, tok.token_id("a").unwrap(), the, eos, tok.token_id("<think>").unwrap()]);
        assert_eq!(tok.encode("a the", false).unwrap(), vec![tok.token_id("a").unwrap(), the]);
        assert_eq!(tok.decode(&ids, false).unwrap(), "<|im_start|>a the<|im_end|><think>");
        // Control tokens are skipped, user-defined ones kept.
        assert_eq!(tok.decode(&ids, true).unwrap(), "a the<think>");
        // No spaces inserted between byte-level tokens, multi-byte chars survive.
        let s = "x  y\n\tz café 日本 🎉";
        assert_eq!(tok.decode(&tok.encode(s, false).unwrap(), false).unwrap(), s);
        // "12" merges with gpt-2 but is split into digits with smollm's \p{N} pre-split.
        assert_eq!(tok.encode("12", false).unwrap().len(), 1);
        let smol = Tokenizer::from_gguf(&synthetic_gguf("smollm")).unwrap();
        assert_eq!(smol.encode("12", false).unwrap().len(), 2);
        // Chat template from GGUF.
        let msgs = [ChatMessage::new("user", "hi")];
        assert_eq!(
            tok.apply_chat_template(&msgs, true, None).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    /// A small SentencePiece vocabulary: specials, 256 byte tokens, a few pieces; the score is
    /// minus the id (earlier pieces merge first), as in real SPM vocabularies.
    fn synthetic_spm_gguf() -> HashMap<String, gguf_file::Value> {
        use gguf_file::Value as V;
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![2i32, 3, 3];
        for b in 0..256 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        for p in ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "ll", "▁he", "llo", "▁hello", "or", "▁w", "ld", "▁wor", "▁world"]
        {
            tokens.push(p.into());
            types.push(1);
        }
        let scores: Vec<V> = (0..tokens.len()).map(|i| V::F32(-(i as f32))).collect();
        let mut md = vocab_metadata("llama", tokens, types);
        md.insert("tokenizer.ggml.scores".into(), V::Array(scores));
        md.insert("tokenizer.ggml.bos_token_id".into(), V::U32(1));
        md.insert("tokenizer.ggml.eos_token_id".into(), V::U32(2));
        md.insert("tokenizer.ggml.unknown_token_id".into(), V::U32(0));
        md
    }

    #[test]
    fn synthetic_gguf_sentencepiece() {
        let tok = Tokenizer::from_gguf(&synthetic_spm_gguf()).unwrap();
        assert!(tok.adds_bos(), "SentencePiece GGUFs add BOS by default (llama.cpp)");
        let hello = tok.token_id("▁hello").unwrap();
        let world = tok.token_id("▁world").unwrap();
        assert_eq!(tok.encode("hello world", true).unwrap(), vec![1, hello, world]);
        assert_eq!(tok.encode("hello world", false).unwrap(), vec![hello, world]);
        // Unknown characters fall back to byte tokens; "<s>" in text is the BOS token.
        let ids = tok.encode("hello 日</s>", false).unwrap();
        let byte = |b: u8| tok.token_id(&format!("<0x{b:02X}>")).unwrap();
        let space = tok.token_id("▁").unwrap();
        assert_eq!(ids, vec![hello, space, byte(0xE6), byte(0x97), byte(0xA5), 2]);
        assert_eq!(tok.decode(&ids, true).unwrap(), "hello 日");
        assert_eq!(tok.decode(&[1, hello, world], true).unwrap(), "hello world");
        let ids = tok.encode("hello 日本 world", false).unwrap();
        check_incremental(&tok, &ids, true);
    }

    #[test]
    fn a_long_sentencepiece_piece_does_not_stall_the_load() {
        // Found with a probe through the gguf fuzz target (fuzz/corpus/gguf/regress-spm-long-piece.gguf):
        // merges were looked up at every split of every piece, quadratic in its length (a 60 KB
        // piece took 5 s in the fuzz build; this 1 MB one would take many minutes).
        use gguf_file::Value as V;
        let mut md = synthetic_spm_gguf();
        let long = format!("▁{}", "l".repeat(1 << 20));
        for (key, v) in [
            ("tokenizer.ggml.tokens", V::String(long.clone())),
            ("tokenizer.ggml.token_type", V::I32(1)),
            ("tokenizer.ggml.scores", V::F32(0.0)),
        ] {
            let Some(V::Array(a)) = md.get_mut(key) else { panic!("{key}") };
            a.push(v);
        }
        let tok = Tokenizer::from_gguf(&md).unwrap();
        assert!(tok.token_id(&long).is_some(), "the piece stays in the vocabulary");
        assert_eq!(tok.encode("hello world", false).unwrap().len(), 2);
    }

    #[test]
    fn every_supported_pre_tokenizer_compiles() {
        for pre in gguf::SUPPORTED_PRE {
            let tok = Tokenizer::from_gguf(&synthetic_gguf(pre)).unwrap_or_else(|e| panic!("{pre}: {e}"));
            let s = "Hello, world! It's 12345 3.14\n\n  x 日本🎉";
            assert_eq!(tok.decode(&tok.encode(s, false).unwrap(), false).unwrap(), s, "pre {pre}");
        }
        let err = Tokenizer::from_gguf(&synthetic_gguf("no-such-pre")).unwrap_err();
        assert!(err.contains("tokenizer.ggml.pre"), "{err}");
    }

    #[test]
    fn gguf_errors_name_the_field() {
        let mut md = synthetic_gguf("gpt-2");
        md.insert("tokenizer.ggml.model".into(), gguf_file::Value::String("bert".into()));
        let err = Tokenizer::from_gguf(&md).unwrap_err();
        assert!(err.contains("tokenizer.ggml.model") && err.contains("bert"), "{err}");
        let mut md = synthetic_gguf("gpt-2");
        md.remove("tokenizer.ggml.merges");
        assert!(Tokenizer::from_gguf(&md).unwrap_err().contains("tokenizer.ggml.merges"));
        assert!(Tokenizer::from_gguf(&HashMap::new()).unwrap_err().contains("tokenizer.ggml.model"));
    }
}
