//! The plans of the families we run, and what the decoder and the fused CUDA path refuse.

use super::*;

fn fixture_plan(name: &str) -> LayerPlan {
    let path = format!("{}/__test__/fixtures/{name}/config.json", env!("CARGO_MANIFEST_DIR"));
    let cfg = ModelConfig::from_hf_json(&std::fs::read_to_string(path).unwrap()).unwrap();
    LayerPlan::build(&cfg)
}

#[test]
fn each_family_is_pre_norm_attention_and_a_silu_mlp_with_its_own_attention_details() {
    let cases = [
        (
            "llama-tiny",
            "layers 0–1: full attention (4 heads, 1 kv, head dim 16, rope 0) · gated MLP (SiLU, 96) · pre-norm (w)",
            "rope 0: theta 10000, rotary dim 16 of 16, half-split",
        ),
        (
            "qwen2-tiny",
            "layers 0–1: full attention (4 heads, 2 kv, head dim 16, rope 0, qkv bias) · gated MLP (SiLU, 128) · pre-norm (w)",
            "rope 0: theta 1000000, rotary dim 16 of 16, half-split",
        ),
        (
            "qwen3-tiny",
            "layers 0–2: full attention (4 heads, 2 kv, head dim 32, rope 0, q/k norm) · gated MLP (SiLU, 128) · pre-norm (w)",
            "rope 0: theta 1000000, rotary dim 32 of 32, half-split",
        ),
    ];
    for (name, layers, rope) in cases {
        let plan = fixture_plan(name);
        assert_eq!(plan.summary(), vec![layers.to_string(), rope.to_string()], "{name}");
        assert_eq!((plan.unsupported(), plan.fused_decode_gap()), (None, None), "{name}");
        assert!(plan.kv_kinds().iter().all(|k| *k == LayerCache::Full), "{name}");
    }
}

fn attention(plan: &mut LayerPlan, layer: usize) -> &mut AttentionSpec {
    match &mut plan.layers[layer].mixer {
        Mixer::Attention(a) => a,
        Mixer::Recurrent(_) => panic!("layer {layer} is recurrent"),
    }
}

/// SmolLM3's layers without RoPE run on the decoder; the fused CUDA decode kernels rotate every
/// layer, so such a plan decodes on the generic path there.
#[test]
fn a_layer_without_rope_runs_generic() {
    let mut plan = fixture_plan("qwen3-tiny");
    attention(&mut plan, 2).rope = None;
    assert_eq!(plan.unsupported(), None);
    assert!(plan.fused_decode_gap().is_some());
    assert!(plan.layers[2].mixer.to_string().contains("no RoPE"), "{}", plan.layers[2].mixer);
}

#[test]
fn what_the_decoder_does_not_run_yet_is_named_not_ignored() {
    type Edit = fn(&mut LayerPlan);
    let cases: [(Edit, &str); 1] = [(|p| attention(p, 0).logit_softcap = Some(50.0), "soft-cap 50")];
    for (edit, named) in cases {
        let mut plan = fixture_plan("qwen3-tiny");
        edit(&mut plan);
        let what = plan.unsupported().expect(named);
        assert!(what.contains(named), "{what:?} should name {named:?}");
        // The fused CUDA decode path covers none of these either: they decode generic there.
        assert!(plan.fused_decode_gap().is_some(), "{named}");
    }
}

/// What the decoder runs (Gemma 3's words) but the fused CUDA decode kernels do not: such a
/// model loads and decodes on the generic path there.
#[test]
fn what_only_the_generic_decoder_runs_is_a_fused_decode_gap() {
    type Edit = fn(&mut LayerPlan);
    let cases: [(Edit, &str); 12] = [
        (|p| attention(p, 1).window = Some(4096), "layer 1: sliding-window attention (4096)"),
        (
            |p| {
                let a = attention(p, 2);
                (a.head_dim, a.scale) = (64, 0.125);
            },
            "layer 2: per-layer head shapes",
        ),
        (|p| p.ropes[0].rotary_dim = 8, "a partial one"),
        (|p| p.residual_multiplier = 0.22, "multipliers"),
        (|p| p.logit_multiplier = 0.5, "multipliers"),
        (|p| attention(p, 0).scale = 0.125, "scale 0.125"),
        (|p| p.layers[1].ffn = FeedForward::GatedMlp { intermediate_size: 128, activation: Activation::GeluTanh }, "GELU-tanh"),
        (|p| p.layers[0].norms = Norms { sandwich: true, weight: NormWeight::OnePlus }, "layer 0: "),
        (|p| p.embedding_scale = 8.0, "multipliers"),
        (|p| p.final_logit_softcap = Some(30.0), "final logit soft-capping"),
        (|p| p.final_norm = NormWeight::OnePlus, "final norm"),
        (|p| p.ropes.push(p.ropes[0].clone()), "more than one rotary embedding"),
    ];
    for (edit, named) in cases {
        let mut plan = fixture_plan("qwen3-tiny");
        edit(&mut plan);
        assert_eq!(plan.unsupported(), None, "{named}");
        let gap = plan.fused_decode_gap().expect(named);
        assert!(gap.contains(named), "{gap:?} should name {named:?}");
    }
}

#[test]
fn a_window_is_what_its_layer_keeps_and_runs_of_layers_print_as_one_line() {
    let mut plan = fixture_plan("qwen3-tiny");
    attention(&mut plan, 1).window = Some(512);
    assert_eq!(plan.kv_kinds(), vec![LayerCache::Full, LayerCache::Window { window: 512 }, LayerCache::Full]);
    let lines = plan.summary();
    assert_eq!(lines.len(), 4, "{lines:#?}");
    assert!(lines[0].starts_with("layer 0: full attention"));
    assert!(lines[1].starts_with("layer 1: sliding-window attention (512)"));
    assert!(lines[2].starts_with("layer 2: full attention"));
    plan.logit_multiplier = 0.5;
    assert_eq!(plan.summary().last().unwrap(), "model: logit multiplier 0.5");
}

/// Gemma 3 as data: sliding and full layers with their own rotary bases, the score scale of
/// `query_pre_attn_scalar`, sandwich `1 + w` norms, a GELU-tanh MLP, √hidden embeddings and
/// soft-capped logits.
#[test]
fn gemma3_is_a_plan_of_sliding_and_full_layers() {
    let plan = fixture_plan("gemma3-tiny");
    let lines = plan.summary();
    let attn = |kind: &str, rope: usize| {
        format!("{kind} (4 heads, 2 kv, head dim 32, rope {rope}, q/k norm, scale 0.20412414523193154) · gated MLP (GELU-tanh, 128) · sandwich norms (1 + w)")
    };
    let sliding = attn("sliding-window attention (8)", 1);
    assert_eq!(
        lines,
        vec![
            format!("layers 0–1: {sliding}"),
            format!("layer 2: {}", attn("full attention", 0)),
            format!("layer 3: {sliding}"),
            "rope 0: theta 1000000, rotary dim 32 of 32, half-split".into(),
            "rope 1: theta 10000, rotary dim 32 of 32, half-split".into(),
            "model: embedding scale 8, final logit soft-cap 30, final norm (1 + w)".to_string(),
        ]
    );
    assert_eq!(plan.layers.len(), 4);
    assert_eq!(
        plan.kv_kinds(),
        vec![
            LayerCache::Window { window: 8 },
            LayerCache::Window { window: 8 },
            LayerCache::Full,
            LayerCache::Window { window: 8 }
        ]
    );
    assert_eq!((plan.ropes.len(), plan.ropes[0].theta, plan.ropes[1].theta), (2, 1e6, 1e4));
    assert_eq!(plan.embedding_scale, 8.0);
    assert_eq!(plan.final_logit_softcap, Some(30.0));
    for (i, l) in plan.layers.iter().enumerate() {
        let Mixer::Attention(a) = &l.mixer else { panic!("layer {i}") };
        assert_eq!(a.rope, Some(if i == 2 { 0 } else { 1 }), "layer {i}");
        assert!(a.qk_norm && (a.scale - 1.0 / 24f64.sqrt()).abs() < 1e-15, "layer {i}");
        assert_eq!(l.norms, Norms { sandwich: true, weight: NormWeight::OnePlus });
        assert_eq!(l.ffn, FeedForward::GatedMlp { intermediate_size: 128, activation: Activation::GeluTanh });
    }
    assert_eq!(plan.final_norm, NormWeight::OnePlus);
    assert_eq!(plan.unsupported(), None);
    assert!(plan.fused_decode_gap().is_some());
}

/// Qwen3-MoE as data: Qwen3's attention, and routed FFN blocks of MoE experts on the layers
/// `decoder_sparse_step` and `mlp_only_layers` select (the others keep the dense MLP). The
/// decoder runs it; the fused CUDA kernels run no routed block, so it decodes generic there.
#[test]
fn qwen3_moe_routes_the_layers_its_config_selects() {
    let raw = crate::model::config::test_config(
        "qwen3_moe",
        4,
        serde_json::json!({"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 4,
                           "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": true}),
    );
    let plan = LayerPlan::build(&ModelConfig::from_hf_json(&raw.to_string()).unwrap());
    let attn = "full attention (2 heads, 1 kv, head dim 4, rope 0, q/k norm)";
    assert_eq!(
        plan.summary()[..3],
        [
            format!("layer 0: {attn} · gated MLP (SiLU, 16) · pre-norm (w)"),
            format!(
                "layer 1: {attn} · routed FFN (8 MoE experts, top 2, SiLU MLPs of 4, top-k weights renormalised) · pre-norm (w)"
            ),
            format!("layers 2–3: {attn} · gated MLP (SiLU, 16) · pre-norm (w)"),
        ]
    );
    assert_eq!(plan.unsupported(), None);
    assert!(plan.fused_decode_gap().unwrap().starts_with("layer 1: "), "{:?}", plan.fused_decode_gap());
}

/// Gemma 4 shaped like its 26B-A4B: values from keys on the full layer, and a routed FFN beside
/// every MLP. Only the generic decoder runs it.
#[test]
fn gemma4_moe_is_values_from_keys_and_a_routed_ffn_beside_the_mlp() {
    let plan = fixture_plan("gemma4-moe-tiny");
    for (i, l) in plan.layers.iter().enumerate() {
        let Mixer::Attention(a) = &l.mixer else { panic!("layer {i}") };
        assert_eq!(a.values_from_keys, i == 2, "layer {i}");
        let FeedForward::MlpAndMoe { moe, .. } = &l.ffn else { panic!("layer {i}: {}", l.ffn) };
        assert_eq!((moe.num_experts, moe.experts_per_token, moe.router), (8, 2, Router::ScaledNorm));
    }
    assert_eq!(plan.unsupported(), None);
    assert!(plan.fused_decode_gap().is_some());
}

/// The hybrids: recurrent layers keep a state (sized by their spec) and no positions, attention
/// layers keep positions; Qwen3.5's attention is gated with `1 + w` norms and a quarter rotated.
#[test]
fn hybrid_plans_name_their_recurrent_layers() {
    let qwen = fixture_plan("qwen35-tiny");
    assert_eq!(
        qwen.summary(),
        vec![
            "layers 0–2: Gated DeltaNet (2 key heads of 16, 4 value heads of 8, conv 4) · gated MLP (SiLU, 96) · pre-norm (1 + w)"
                .to_string(),
            "layer 3: full attention (4 heads, 2 kv, head dim 16, rope 0, q/k norm, output gate) · gated MLP (SiLU, 96) · pre-norm (1 + w)"
                .into(),
            "rope 0: theta 10000, rotary dim 4 of 16, half-split".into(),
            "model: final norm (1 + w), recurrent state 9600 bytes per sequence (f32)".into(),
        ]
    );
    // Per sequence: the convolution's last 3 inputs of 96 channels, 4 matrices of 16 × 8.
    let state = LayerCache::State { bytes: (3 * 96 + 4 * 16 * 8) * 4 };
    assert_eq!(qwen.kv_kinds(), vec![state, state, state, LayerCache::Full]);
    assert_eq!(qwen.unsupported(), None);
    assert!(qwen.fused_decode_gap().is_some());
    let lfm2 = fixture_plan("lfm2-tiny");
    assert_eq!(lfm2.summary()[0], "layers 0–1: short conv (3 taps) · gated MLP (SiLU, 160) · pre-norm (w)");
    let conv = LayerCache::State { bytes: 2 * 64 * 4 };
    assert_eq!(lfm2.kv_kinds(), vec![conv, conv, LayerCache::Full, conv]);
    // The fused CUDA decode kernels run attention layers only.
    assert!(lfm2.fused_decode_gap().unwrap().starts_with("layer 0: short conv"), "{:?}", lfm2.fused_decode_gap());
}
