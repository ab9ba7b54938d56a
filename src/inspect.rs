//! `inspect`: what a model or a PEFT adapter is, read from its files without loading any
//! weights (the CLI's `expert-runtime inspect`, `inspect()` in JS).
//!
//! A model (HF directory or GGUF file) is read as a load reads it up to the weights
//! ([`model::inspect`]), plus its tokenizer, special tokens and chat template. An adapter
//! directory (`adapter_config.json` + `adapter_model.safetensors`) is read with the expert
//! loader's own parser ([`AdapterConfig`]) and the safetensors header. Whether an adapter fits
//! a given base needs the base's weights and is left to `loadExpert`.
//!
//! Every file is untrusted: each read goes through the checks a load applies, so a hostile
//! file is a typed error (`INVALID_MODEL`, `INVALID_ADAPTER`, …), never a crash or an
//! unbounded allocation. A tokenizer that cannot be built is reported in `warnings` (the rest
//! of the model's description is still useful); a load of that model would fail.

use std::path::Path;

use serde_json::Value;

use crate::engine::load::{end_of_generation_ids, read_generation_config, GenerationDefaults};
use crate::error::{EngineError, Result};
use crate::experts::peft::{AdapterConfig, PeftType};
use crate::experts::Manifest;
use crate::files;
use crate::gguf_meta;
use crate::model::inspect::{self as model_inspect, WeightsSummary};
use crate::model::loader::ModelFormat;
use crate::model::ModelConfig;
use crate::tokenizer::Tokenizer;

pub enum Inspection {
    Model(Box<ModelInspection>),
    Adapter(Box<AdapterInspection>),
}

pub struct ModelInspection {
    pub config: ModelConfig,
    pub weights: WeightsSummary,
    /// `None` when it could not be built (the reason is in `warnings`).
    pub tokenizer: Option<TokenizerInspection>,
    /// End-of-generation ids as the engine gathers them (config, `generation_config.json`,
    /// tokenizer; sorted), with their vocabulary strings.
    pub eos_tokens: Vec<(u32, Option<String>)>,
    pub warnings: Vec<String>,
}

pub struct TokenizerInspection {
    /// `tokenizer.json` or `gguf`.
    pub source: &'static str,
    /// The tokenizer.json model type (`BPE`, `Unigram`, `WordPiece`, `WordLevel`) or GGUF
    /// `tokenizer.ggml.model` (`gpt2`, `llama`).
    pub model: String,
    /// GGUF `tokenizer.ggml.pre`.
    pub pre: Option<String>,
    pub vocab_size: usize,
    pub bos_token: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token: Option<String>,
    /// `(id, its vocabulary string)` of every end-of-generation id.
    pub eos_tokens: Vec<(u32, Option<String>)>,
    /// Whether encoding prepends BOS itself (GGUF `add_bos_token`).
    pub adds_bos: bool,
    pub chat_template: Option<String>,
}

pub struct AdapterInspection {
    /// `lora`, `rslora`, `dora`, `ia3`, `lokr` or `prompt`.
    pub kind: &'static str,
    /// `r` (LoRA, DoRA, LoKr).
    pub rank: Option<usize>,
    /// `lora_alpha` (LoRA, DoRA) or `alpha` (LoKr).
    pub alpha: Option<f64>,
    /// `target_modules` as written: names, or one regex.
    pub target_modules: Vec<String>,
    pub target_modules_regex: bool,
    /// Prompt tuning's virtual tokens.
    pub num_virtual_tokens: Option<usize>,
    /// `base_model_name_or_path`.
    pub base_model: Option<String>,
    /// PEFT `auto_mapping.base_model_class`.
    pub base_model_class: Option<String>,
    /// `manifest.json`'s `name` and `description`, when there is one.
    pub name: Option<String>,
    pub description: Option<String>,
    pub weights: WeightsSummary,
}

/// Describes the model or adapter at `path`.
pub fn inspect(path: &Path) -> Result<Inspection> {
    if path.is_dir() && path.join("adapter_config.json").exists() {
        return inspect_adapter(path).map(|a| Inspection::Adapter(Box::new(a)));
    }
    inspect_model(path).map(|m| Inspection::Model(Box::new(m)))
}

fn inspect_model(path: &Path) -> Result<ModelInspection> {
    let summary = model_inspect::summarize(path)?;
    let mut warnings = Vec::new();
    let mut defaults = GenerationDefaults::default();
    let tokenizer = match &summary.format {
        ModelFormat::HfDir(dir) => {
            // What a load refuses is a warning here: the rest of the description still holds.
            match read_generation_config(dir) {
                Ok(d) => defaults = d,
                Err(e) => warnings.push(format!("{e} (a load would fail)")),
            }
            Tokenizer::from_dir(dir).map(|t| (describe_tokenizer(&t, "tokenizer.json", tokenizer_json_model(&t), None), t))
        }
        ModelFormat::Gguf(src) => {
            let md = src.metadata();
            let string = |k: &str| gguf_meta::get_str(md, k).ok().flatten().map(str::to_owned);
            Tokenizer::from_gguf(md).map(|t| {
                let model = string("tokenizer.ggml.model").unwrap_or_default();
                (describe_tokenizer(&t, "gguf", model, string("tokenizer.ggml.pre")), t)
            })
        }
    };
    let tokenizer = tokenizer.map_err(|e| warnings.push(format!("the tokenizer cannot be built (a load would fail): {e}"))).ok();
    let eos = end_of_generation_ids(&summary.config, &defaults, tokenizer.as_ref().map(|(_, t)| t));
    let spelling = |id: u32| tokenizer.as_ref().and_then(|(_, t)| t.id_to_token(id));
    let eos_tokens = eos.iter().map(|&id| (id, spelling(id))).collect();
    Ok(ModelInspection {
        config: summary.config,
        weights: summary.weights,
        tokenizer: tokenizer.map(|(described, _)| described),
        eos_tokens,
        warnings,
    })
}

fn tokenizer_json_model(t: &Tokenizer) -> String {
    use tokenizers::models::ModelWrapper;
    match t.inner().get_model() {
        ModelWrapper::BPE(_) => "BPE",
        ModelWrapper::Unigram(_) => "Unigram",
        ModelWrapper::WordPiece(_) => "WordPiece",
        ModelWrapper::WordLevel(_) => "WordLevel",
    }
    .to_string()
}

fn describe_tokenizer(t: &Tokenizer, source: &'static str, model: String, pre: Option<String>) -> TokenizerInspection {
    TokenizerInspection {
        source,
        model,
        pre,
        vocab_size: t.vocab_size(),
        bos_token: t.bos_token().map(str::to_owned),
        bos_token_id: t.bos_token_id(),
        eos_token: t.eos_token().map(str::to_owned),
        eos_tokens: t.eos_token_ids().into_iter().map(|id| (id, t.id_to_token(id))).collect(),
        adds_bos: t.adds_bos(),
        chat_template: t.chat_template().map(str::to_owned),
    }
}

fn inspect_adapter(dir: &Path) -> Result<AdapterInspection> {
    let cfg_path = dir.join("adapter_config.json");
    let text = files::read_text(&cfg_path).map_err(|e| EngineError::InvalidAdapter(format!("{}: {e}", cfg_path.display())))?;
    // The loader's parser: what it refuses, inspect refuses.
    let cfg = AdapterConfig::parse(&text)?;
    let raw: Value = serde_json::from_str(&text).map_err(|e| EngineError::invalid_adapter("adapter_config.json", e))?;
    let manifest = match files::read_text(&dir.join("manifest.json")) {
        Ok(t) => Some(Manifest::parse(&t)?),
        Err(files::ReadError::NotFound) => None,
        Err(e) => return Err(EngineError::invalid_adapter("manifest.json", e)),
    };
    let weights_path = dir.join("adapter_model.safetensors");
    if !weights_path.exists() {
        return Err(EngineError::InvalidAdapter(format!("{} is missing", weights_path.display())));
    }
    let weights = model_inspect::safetensors_summary(&[weights_path]).map_err(EngineError::InvalidAdapter)?;
    let kind = match cfg.peft_type {
        PeftType::Lora if cfg.use_dora => "dora",
        PeftType::Lora if cfg.use_rslora => "rslora",
        PeftType::Lora => "lora",
        PeftType::Ia3 => "ia3",
        PeftType::Lokr => "lokr",
        PeftType::PromptTuning => "prompt",
    };
    let ranked = matches!(cfg.peft_type, PeftType::Lora | PeftType::Lokr);
    let (target_modules, target_modules_regex) = match raw.get("target_modules") {
        Some(Value::String(s)) => (vec![s.clone()], s != "all-linear"),
        Some(Value::Array(a)) => (a.iter().filter_map(Value::as_str).map(String::from).collect(), false),
        _ => (Vec::new(), false),
    };
    let (name, description) = manifest.map(|m| (m.name, m.description)).unwrap_or_default();
    Ok(AdapterInspection {
        kind,
        rank: ranked.then_some(cfg.r),
        alpha: ranked.then_some(cfg.alpha),
        target_modules,
        target_modules_regex,
        num_virtual_tokens: (cfg.peft_type == PeftType::PromptTuning).then_some(cfg.num_virtual_tokens),
        base_model: raw.get("base_model_name_or_path").and_then(Value::as_str).map(String::from),
        base_model_class: cfg.base_model_class,
        name,
        description,
        weights,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(p: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("__test__/fixtures").join(p)
    }

    fn json(p: &str) -> Value {
        serde_json::from_str(&std::fs::read_to_string(fixture(p)).unwrap()).unwrap()
    }

    fn model(p: &str) -> ModelInspection {
        match inspect(&fixture(p)).unwrap() {
            Inspection::Model(m) => *m,
            Inspection::Adapter(_) => panic!("{p} is a model"),
        }
    }

    fn adapter(p: &str) -> AdapterInspection {
        match inspect(&fixture(p)).unwrap() {
            Inspection::Adapter(a) => *a,
            Inspection::Model(_) => panic!("{p} is an adapter"),
        }
    }

    #[test]
    fn a_model_directory_is_described_from_its_files() {
        let cfg = json("qwen3-tiny/config.json");
        let m = model("qwen3-tiny");
        assert_eq!(m.config.arch.name(), cfg["model_type"]);
        assert_eq!(m.config.num_layers as u64, cfg["num_hidden_layers"].as_u64().unwrap());
        assert_eq!(m.config.head_dim as u64, cfg["head_dim"].as_u64().unwrap());
        assert_eq!(m.config.max_position_embeddings as u64, cfg["max_position_embeddings"].as_u64().unwrap());
        let t = m.tokenizer.unwrap();
        assert_eq!((t.source, t.model.as_str()), ("tokenizer.json", "BPE"));
        let tcfg = json("qwen3-tiny/tokenizer_config.json");
        assert_eq!(t.eos_token.as_deref(), tcfg["eos_token"].as_str());
        assert_eq!(t.eos_tokens, [(397, Some("<|im_end|>".to_string()))]);
        assert_eq!(t.chat_template.as_deref(), tcfg["chat_template"].as_str());
        // config 397, generation_config [397, 395].
        assert_eq!(m.eos_tokens, [(395, Some("<|endoftext|>".to_string())), (397, Some("<|im_end|>".to_string()))]);
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    }

    #[test]
    fn a_gguf_is_described_from_its_header() {
        let m = model("llama-tiny/model-q8_0.gguf");
        assert_eq!(m.config.arch.name(), "llama");
        assert!(!m.config.tie_word_embeddings);
        let t = m.tokenizer.unwrap();
        assert_eq!((t.source, t.model.as_str(), t.pre.as_deref()), ("gguf", "gpt2", Some("qwen2")));
        assert_eq!(t.vocab_size, 400);
        assert!(t.chat_template.is_some_and(|s| s.contains("im_start")));
    }

    #[test]
    fn adapters_are_described_with_the_loaders_parser() {
        let cfg = json("adapters/lora/adapter_config.json");
        let a = adapter("adapters/lora");
        assert_eq!(a.kind, "lora");
        assert_eq!(a.rank.map(|r| r as u64), cfg["r"].as_u64());
        assert_eq!(a.alpha, cfg["lora_alpha"].as_f64());
        let mut targets = a.target_modules.clone();
        targets.sort();
        let mut expected: Vec<String> =
            cfg["target_modules"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
        expected.sort();
        assert_eq!(targets, expected);
        assert_eq!(a.base_model.as_deref(), cfg["base_model_name_or_path"].as_str());
        assert_eq!(a.name.as_deref(), Some("lora"));
        // 3 layers × 7 modules × (A, B).
        assert_eq!(a.weights.tensors, 42);
        assert_eq!(adapter("adapters/rslora").kind, "rslora");
        assert_eq!(adapter("adapters/dora").kind, "dora");
        assert_eq!(adapter("adapters/ia3").kind, "ia3");
        assert_eq!(adapter("adapters/lokr").kind, "lokr");
        let p = adapter("adapters/prompt");
        assert_eq!((p.kind, p.num_virtual_tokens, p.rank), ("prompt", Some(4), None));
    }

    #[test]
    fn broken_adapters_are_typed_errors() {
        let dir = std::env::temp_dir().join(format!("er-inspect-adapter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("adapter_config.json"), r#"{"peft_type":"LOHA","r":4}"#).unwrap();
        assert_eq!(inspect(&dir).err().unwrap().code(), "UNSUPPORTED_ADAPTER");
        std::fs::copy(fixture("adapters/lora/adapter_config.json"), dir.join("adapter_config.json")).unwrap();
        assert_eq!(inspect(&dir).err().unwrap().code(), "INVALID_ADAPTER");
        // A header declaring 2 GB.
        let mut bytes = (2u64 << 30).to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        std::fs::write(dir.join("adapter_model.safetensors"), bytes).unwrap();
        assert_eq!(inspect(&dir).err().unwrap().code(), "INVALID_ADAPTER");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
