//! The text model's config inside a multimodal checkpoint's `config.json` (Gemma 3's and
//! Gemma 4's `…ForConditionalGeneration`): its `text_config`, with the text config class's
//! defaults for the fields the checkpoint leaves out (the published configs name only what
//! differs) and the fields it keeps at the top level. Images and audio are not inputs of the
//! runtime: the other towers are not read.

use serde_json::{Map, Value};

use crate::error::{EngineError, Result};

/// Fields a multimodal config may hold at its top level rather than in `text_config` (the
/// published checkpoints put `eos_token_id` and the dtype there); `text_config`'s own win.
const TOP_LEVEL_FALLBACKS: &[&str] =
    &["bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype", "tie_word_embeddings"];

/// The text config of `raw` when its `model_type` is `outer` and it has a `text_config` (whose
/// own `model_type`, if any, must be `inner`), as a text model's config of `model_type` `inner`
/// over `defaults`; `None` for any other config.
pub fn text_config(raw: &Value, outer: &str, inner: &str, defaults: Value) -> Result<Option<Value>> {
    if raw.get("model_type").and_then(Value::as_str) != Some(outer) {
        return Ok(None);
    }
    let Some(text) = raw.get("text_config") else { return Ok(None) };
    let bad = |m: String| EngineError::InvalidModel(format!("config.json ({outer}): {m}"));
    let Value::Object(fields) = text else {
        return Err(bad(format!("text_config must be an object, got {text}")));
    };
    match fields.get("model_type") {
        None | Some(Value::Null) => {}
        Some(t) if t == inner => {}
        Some(t) => return Err(bad(format!("text_config.model_type must be {inner}, got {t}"))),
    }
    let mut out = match defaults {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    for k in TOP_LEVEL_FALLBACKS {
        if let Some(v) = raw.get(*k).filter(|v| !v.is_null()) {
            out.insert((*k).into(), v.clone());
        }
    }
    for (k, v) in fields {
        out.insert(k.clone(), v.clone());
    }
    out.insert("model_type".into(), Value::from(inner));
    Ok(Some(Value::Object(out)))
}
