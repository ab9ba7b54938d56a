//! `manifest.json` beside an adapter: its name, description, version, application order,
//! routing hints (for the router) and the base model it was trained for.
//!
//! `base_model` may be an object (`{ "architecture": "qwen3", "hidden_size": 1024,
//! "num_layers": 28, "vocab_size": … }`, every field present must match) or a model name such as
//! `Qwen/Qwen3-0.6B`, from which the family and the parameter count are read where the name
//! states them; a family or size that contradicts the loaded base rejects the adapter.

use serde_json::Value;

use super::router::Keyword;
use crate::error::{EngineError, Result};
use crate::model::config::{Arch, ModelConfig};
use crate::tokenizer::reasoning::ReasoningSyntax;

/// Routing hints for the router (`experts::router`).
#[derive(Clone, Debug, Default)]
pub struct Routing {
    pub keywords: Vec<Keyword>,
    pub exclude_keywords: Vec<Keyword>,
    /// Multiplies the keyword score; 1 when the manifest does not say.
    pub priority: f64,
    /// Typical queries: embedded when the expert loads, compared with each routed query.
    pub examples: Vec<String>,
}

/// Bounds on a manifest's routing data (a manifest is untrusted input).
const MAX_KEYWORDS: usize = 1024;
const MAX_EXAMPLES: usize = 256;
const MAX_ROUTING_TEXT_BYTES: usize = 4096;

fn bounded(v: Vec<String>, field: &str, max: usize) -> Result<Vec<String>> {
    if v.len() > max {
        return Err(EngineError::InvalidAdapter(format!("manifest.json: {field} lists {} entries (at most {max})", v.len())));
    }
    if let Some(s) = v.iter().find(|s| s.len() > MAX_ROUTING_TEXT_BYTES) {
        return Err(EngineError::InvalidAdapter(format!(
            "manifest.json: an entry of {field} is {} bytes long (at most {MAX_ROUTING_TEXT_BYTES})",
            s.len()
        )));
    }
    if v.iter().any(|s| s.trim().is_empty()) {
        return Err(EngineError::InvalidAdapter(format!("manifest.json: {field} has an empty entry")));
    }
    Ok(v)
}

#[derive(Clone, Debug, Default)]
pub struct Manifest {
    pub name: Option<String>,
    pub description: Option<String>,
    pub version: Option<String>,
    pub load_order: i64,
    pub routing: Routing,
    pub base_model: Option<Value>,
    /// The markers the expert makes the model think between (`reasoning: { open, close }`),
    /// for a base whose chat template knows no thoughts.
    pub reasoning: Option<ReasoningSyntax>,
    /// The whole file, for JS (`expert.manifest`).
    pub raw: Value,
}

fn strings(v: Option<&Value>, field: &str) -> Result<Vec<String>> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(String::from))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| EngineError::InvalidAdapter(format!("manifest.json: {field} must list strings"))),
        Some(_) => Err(EngineError::InvalidAdapter(format!("manifest.json: {field} must be a list of strings"))),
    }
}

/// `reasoning: { "open": "<think>", "close": "</think>" }` (both strings, checked by
/// [`ReasoningSyntax::new`]); any other field is refused, since it would be ignored.
fn reasoning(v: Option<&Value>) -> Result<Option<ReasoningSyntax>> {
    let bad = |m: String| EngineError::InvalidAdapter(format!("manifest.json: {m}"));
    let o = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(bad("reasoning must be an object { open, close }".into())),
    };
    if let Some(k) = o.keys().find(|k| !matches!(k.as_str(), "open" | "close")) {
        return Err(bad(format!(
            "reasoning has an unknown field {:?} (it takes open and close)",
            k.chars().take(40).collect::<String>()
        )));
    }
    let marker = |k: &str| o.get(k).and_then(Value::as_str).ok_or_else(|| bad(format!("reasoning.{k} must be a string")));
    ReasoningSyntax::new(marker("open")?, marker("close")?).map(Some).map_err(bad)
}

impl Manifest {
    pub fn parse(text: &str) -> Result<Self> {
        let raw: Value = serde_json::from_str(text).map_err(|e| EngineError::invalid_adapter("manifest.json", e))?;
        if !raw.is_object() {
            return Err(EngineError::InvalidAdapter("manifest.json must hold a JSON object".into()));
        }
        let string = |k: &str| -> Result<Option<String>> {
            match raw.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(EngineError::InvalidAdapter(format!("manifest.json: {k} must be a string"))),
            }
        };
        let load_order = match raw.get("load_order") {
            None | Some(Value::Null) => 0,
            Some(v) => {
                v.as_i64().ok_or_else(|| EngineError::InvalidAdapter("manifest.json: load_order must be an integer".into()))?
            }
        };
        let r = raw.get("routing");
        if r.is_some_and(|r| !r.is_object() && !r.is_null()) {
            return Err(EngineError::InvalidAdapter("manifest.json: routing must be an object".into()));
        }
        let list = |field: &str, max: usize| -> Result<Vec<String>> {
            bounded(strings(r.and_then(|r| r.get(field)), &format!("routing.{field}"))?, &format!("routing.{field}"), max)
        };
        let keywords =
            |field: &str| -> Result<Vec<Keyword>> { Ok(list(field, MAX_KEYWORDS)?.iter().map(|k| Keyword::new(k)).collect()) };
        let priority = match r.and_then(|r| r.get("priority")) {
            None | Some(Value::Null) => 1.0,
            Some(v) => v.as_f64().filter(|p| p.is_finite() && (0.0..=1e6).contains(p)).ok_or_else(|| {
                EngineError::InvalidAdapter("manifest.json: routing.priority must be a number from 0 to 1e6".into())
            })?,
        };
        let routing = Routing {
            keywords: keywords("keywords")?,
            exclude_keywords: keywords("exclude_keywords")?,
            priority,
            examples: list("examples", MAX_EXAMPLES)?,
        };
        Ok(Self {
            name: string("name")?,
            description: string("description")?,
            version: string("version")?,
            load_order,
            routing,
            base_model: raw.get("base_model").filter(|v| !v.is_null()).cloned(),
            reasoning: reasoning(raw.get("reasoning"))?,
            raw,
        })
    }

    /// Fails with `INVALID_ADAPTER` when `base_model` names another model than `cfg`.
    pub fn check_base(&self, cfg: &ModelConfig) -> Result<()> {
        match &self.base_model {
            None => Ok(()),
            Some(Value::String(name)) => check_base_name(name, cfg),
            Some(Value::Object(o)) => {
                let ours = describe(cfg);
                if let Some(a) = o.get("architecture").and_then(Value::as_str) {
                    if family(a) != Some(cfg.arch) {
                        return Err(mismatch(&format!("architecture {a}"), &ours));
                    }
                }
                for (k, have) in [
                    ("hidden_size", cfg.hidden_size),
                    ("num_layers", cfg.num_layers),
                    ("num_hidden_layers", cfg.num_layers),
                    ("vocab_size", cfg.vocab_size),
                    ("intermediate_size", cfg.intermediate_size),
                ] {
                    if let Some(want) = o.get(k).and_then(Value::as_u64) {
                        if want as usize != have {
                            return Err(mismatch(&format!("{k} {want}"), &ours));
                        }
                    }
                }
                Ok(())
            }
            Some(_) => Err(EngineError::InvalidAdapter("manifest.json: base_model must be a string or an object".into())),
        }
    }
}

fn describe(cfg: &ModelConfig) -> String {
    format!(
        "{} with {} layers, hidden size {} (~{})",
        cfg.arch.name(),
        cfg.num_layers,
        cfg.hidden_size,
        human_params(parameter_count(cfg) as f64)
    )
}

fn mismatch(what: &str, ours: &str) -> EngineError {
    EngineError::InvalidAdapter(format!("the adapter was made for a base model with {what}, but this runtime runs {ours}"))
}

/// `qwen3` / `Qwen3ForCausalLM` / `Qwen/Qwen3-0.6B` → the family, where one is named.
pub fn family(name: &str) -> Option<Arch> {
    let n = name.to_ascii_lowercase();
    if n.contains("qwen3") {
        Some(Arch::Qwen3)
    } else if n.contains("qwen2") {
        Some(Arch::Qwen2)
    } else if n.contains("llama") || n.contains("smollm") {
        Some(Arch::Llama)
    } else {
        None
    }
}

/// The parameter count a name states (`…-135M…`, `…-0.6B…`).
fn stated_size(name: &str) -> Option<f64> {
    let re = regex::Regex::new(r"(?i)(?:^|[-_/ ])(\d+(?:\.\d+)?)([mb])(?:$|[-_/ .])").expect("valid regex");
    let c = re.captures(name)?;
    let x: f64 = c[1].parse().ok()?;
    Some(if c[2].eq_ignore_ascii_case("b") { x * 1e9 } else { x * 1e6 })
}

fn check_base_name(name: &str, cfg: &ModelConfig) -> Result<()> {
    if let Some(f) = family(name) {
        if f != cfg.arch {
            return Err(mismatch(&format!("architecture {} ({name})", f.name()), &describe(cfg)));
        }
    }
    if let Some(size) = stated_size(name) {
        let have = parameter_count(cfg) as f64;
        // Names round sizes (Qwen3-0.6B has 0.596 B parameters); a factor of 1.5 either way
        // separates every neighbouring size of a family.
        if !(have / 1.5..=have * 1.5).contains(&size) {
            return Err(mismatch(&format!("{} ({name})", human_params(size)), &describe(cfg)));
        }
    }
    Ok(())
}

fn human_params(n: f64) -> String {
    if n >= 1e9 {
        format!("{:.2}B params", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.0}M params", n / 1e6)
    } else {
        format!("{:.0}K params", n / 1e3)
    }
}

/// Weights of the decoder (embeddings counted once when tied). Saturates: the sizes a config
/// may declare multiply past `usize` (heads × head_dim × hidden alone reach 2^60).
pub fn parameter_count(cfg: &ModelConfig) -> usize {
    let (h, i, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let mul = |xs: &[usize]| xs.iter().fold(1usize, |p, &x| p.saturating_mul(x));
    let sum = |xs: &[usize]| xs.iter().fold(0usize, |s, &x| s.saturating_add(x));
    let attn = sum(&[mul(&[h, cfg.num_heads, hd, 2]), mul(&[h, cfg.num_kv_heads, hd, 2])]);
    let mlp = mul(&[3, h, i]);
    let embed = mul(&[cfg.vocab_size, h, if cfg.tie_word_embeddings { 1 } else { 2 }]);
    sum(&[embed, mul(&[cfg.num_layers, sum(&[attn, mlp, mul(&[2, h])])]), h])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_families_from_names() {
        assert_eq!(stated_size("Qwen/Qwen3-0.6B"), Some(0.6e9));
        assert_eq!(stated_size("HuggingFaceTB/SmolLM2-135M-Instruct"), Some(135e6));
        assert_eq!(stated_size("my-model"), None);
        assert_eq!(family("Qwen/Qwen2.5-Coder-0.5B"), Some(Arch::Qwen2));
        assert_eq!(family("HuggingFaceTB/SmolLM2-135M-Instruct"), Some(Arch::Llama));
        assert_eq!(family("Qwen3ForCausalLM"), Some(Arch::Qwen3));
    }

    #[test]
    fn reasoning_markers() {
        let m = Manifest::parse(r#"{"reasoning":{"open":"<think>","close":"</think>"}}"#).unwrap();
        assert_eq!(m.reasoning, Some(ReasoningSyntax::think()));
        assert_eq!(Manifest::parse("{}").unwrap().reasoning, None);
        for bad in [
            r#"{"reasoning":"think"}"#,
            r#"{"reasoning":{"open":"<think>"}}"#,
            r#"{"reasoning":{"open":"<think>","close":"</think>","budget":5}}"#,
            r#"{"reasoning":{"open":"","close":"</think>"}}"#,
            r#"{"reasoning":{"open":7,"close":"</think>"}}"#,
        ] {
            assert_eq!(Manifest::parse(bad).unwrap_err().code(), "INVALID_ADAPTER", "{bad}");
        }
    }

    #[test]
    fn parameter_count_saturates() {
        // Seen in review, reproduced through the config_json fuzz target
        // (fuzz/corpus/config_json/regress-parameter-count-overflow.json): sizes within the
        // config limits overflowed the product (a panic with overflow checks, a wrap without).
        let text = r#"{"model_type":"qwen3","vocab_size":10,"hidden_size":1048576,"intermediate_size":16,
            "num_hidden_layers":4,"num_attention_heads":1048576,"num_key_value_heads":1048576,"head_dim":1048576,
            "rms_norm_eps":1e-6,"max_position_embeddings":64}"#;
        let cfg = ModelConfig::from_hf_json(text).unwrap();
        assert_eq!(parameter_count(&cfg), usize::MAX);
        let e = Manifest::parse(r#"{"base_model":"Qwen/Qwen3-0.6B"}"#).unwrap().check_base(&cfg).unwrap_err();
        assert_eq!(e.code(), "INVALID_ADAPTER");
    }

    #[test]
    fn manifest_fields() {
        let m = Manifest::parse(r#"{"name":"sql","load_order":2,"routing":{"keywords":["sql"],"priority":3}}"#).unwrap();
        assert_eq!((m.name.as_deref(), m.load_order, m.routing.priority), (Some("sql"), 2, 3.0));
        assert_eq!(Manifest::parse(r#"{"load_order":"x"}"#).unwrap_err().code(), "INVALID_ADAPTER");
        assert_eq!(Manifest::parse("[1]").unwrap_err().code(), "INVALID_ADAPTER");
        assert_eq!(Manifest::parse("{}").unwrap().routing.priority, 1.0, "priority defaults to 1");
        for bad in [
            r#"{"routing":[]}"#,
            r#"{"routing":{"priority":"high"}}"#,
            r#"{"routing":{"priority":-1}}"#,
            r#"{"routing":{"keywords":[""]}}"#,
            r#"{"routing":{"examples":[1]}}"#,
        ] {
            assert_eq!(Manifest::parse(bad).unwrap_err().code(), "INVALID_ADAPTER", "{bad}");
        }
        let many = format!(r#"{{"routing":{{"examples":{}}}}}"#, serde_json::to_string(&vec!["q"; 257]).unwrap());
        assert_eq!(Manifest::parse(&many).unwrap_err().code(), "INVALID_ADAPTER");
        let long = format!(r#"{{"routing":{{"keywords":["{}"]}}}}"#, "k".repeat(4097));
        assert_eq!(Manifest::parse(&long).unwrap_err().code(), "INVALID_ADAPTER");
    }
}
