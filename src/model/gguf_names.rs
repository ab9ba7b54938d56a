//! HF tensor names, as the decoder asks for weights, translated to the names llama.cpp's
//! converter gives them in a GGUF file (`model.layers.0.self_attn.q_proj` → `blk.0.attn_q`).

/// How a family's file names what differs between families.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GgufStyle {
    Plain,
    /// Sandwich norms: HF's `post_attention_layernorm` follows attention (`post_attention_norm`)
    /// and `pre_feedforward_layernorm` is what pre-norm files call `ffn_norm`; norm weights
    /// stored as `1 + w`.
    Gemma,
    /// Qwen3.5: `post_attention_norm` before the MLP, norm weights stored as `1 + w`, the Gated
    /// DeltaNet's tensors as `attn_qkv` / `attn_gate` / `ssm_*`.
    Qwen35,
    /// LFM2: the final norm is `token_embd_norm`, the convolutions `shortconv.*`.
    Lfm2,
}

impl GgufStyle {
    /// The style of a file of `general.architecture` `arch`.
    pub(super) fn of(arch: &str) -> Self {
        match arch {
            a if a.starts_with("gemma") => GgufStyle::Gemma,
            "qwen35" => GgufStyle::Qwen35,
            "lfm2" => GgufStyle::Lfm2,
            _ => GgufStyle::Plain,
        }
    }
}

/// HF tensor name → llama.cpp GGUF tensor name, for a file of `style`. Where llama.cpp's name
/// carries its own suffix (`ssm_dt.bias`, `ssm_a`) it is returned whole.
pub(super) fn gguf_name(hf: &str, style: GgufStyle) -> String {
    let gemma = style == GgufStyle::Gemma;
    if let Some(rest) = hf.strip_prefix("model.layers.") {
        let (idx, tail) = rest.split_once('.').unwrap_or((rest, ""));
        let t = match tail {
            "input_layernorm" => "attn_norm",
            "post_attention_layernorm" if gemma || style == GgufStyle::Qwen35 => "post_attention_norm",
            "pre_feedforward_layernorm" => "ffn_norm",
            "post_feedforward_layernorm" => "post_ffw_norm",
            "post_attention_layernorm" => "ffn_norm",
            "self_attn.q_proj" => "attn_q",
            "self_attn.k_proj" => "attn_k",
            "self_attn.v_proj" => "attn_v",
            "self_attn.o_proj" => "attn_output",
            // Fused projections (Phi-3): Q, K and V rows in one tensor; the gate's rows then the
            // up projection's in what other files call `ffn_up`.
            "self_attn.qkv_proj" => "attn_qkv",
            "mlp.gate_up_proj" => "ffn_up",
            "self_attn.q_norm" => "attn_q_norm",
            "self_attn.k_norm" => "attn_k_norm",
            "mlp.gate_proj" => "ffn_gate",
            "mlp.up_proj" => "ffn_up",
            "mlp.down_proj" => "ffn_down",
            // A routed FFN: the router and the MoE experts' stacked projections (Qwen3-MoE's
            // under `mlp`; Gemma 4's beside it, with the router's scales and its extra norms).
            "mlp.gate" => "ffn_gate_inp",
            "mlp.experts.gate_proj" | "experts.gate_proj" => "ffn_gate_exps",
            "mlp.experts.up_proj" | "experts.up_proj" => "ffn_up_exps",
            "mlp.experts.down_proj" | "experts.down_proj" => "ffn_down_exps",
            "experts.gate_up_proj" => "ffn_gate_up_exps",
            "router.proj" => "ffn_gate_inp",
            "router.scale" => "ffn_gate_inp.scale",
            "router.per_expert_scale" => "ffn_down_exps.scale",
            "pre_feedforward_layernorm_2" => "pre_ffw_norm_2",
            "post_feedforward_layernorm_1" => "post_ffw_norm_1",
            "post_feedforward_layernorm_2" => "post_ffw_norm_2",
            // Gemma 4's layer scalar and per-layer input branch.
            "layer_scalar" => "layer_output_scale",
            "per_layer_input_gate" => "inp_gate",
            "per_layer_projection" => "proj",
            "post_per_layer_input_norm" => "post_norm",
            // Qwen3.5's Gated DeltaNet (`ssm_a` holds −exp(A_log)).
            "linear_attn.in_proj_qkv" => "attn_qkv",
            "linear_attn.in_proj_z" => "attn_gate",
            "linear_attn.in_proj_b" => "ssm_beta",
            "linear_attn.in_proj_a" => "ssm_alpha",
            "linear_attn.conv1d" => "ssm_conv1d",
            "linear_attn.dt_bias" => "ssm_dt.bias",
            "linear_attn.A" => "ssm_a",
            "linear_attn.norm" => "ssm_norm",
            "linear_attn.out_proj" => "ssm_out",
            // LFM2's short convolution.
            "conv.in_proj" => "shortconv.in_proj",
            "conv.conv" => "shortconv.conv",
            "conv.out_proj" => "shortconv.out_proj",
            other => other,
        };
        return format!("blk.{idx}.{t}");
    }
    match hf {
        "model.embed_tokens" => "token_embd".into(),
        "model.norm" if style == GgufStyle::Lfm2 => "token_embd_norm".into(),
        "model.norm" => "output_norm".into(),
        "model.embed_tokens_per_layer" => "per_layer_token_embd".into(),
        "model.per_layer_model_projection" => "per_layer_model_proj".into(),
        "model.per_layer_projection_norm" => "per_layer_proj_norm".into(),
        "lm_head" => "output".into(),
        other => other.into(),
    }
}
