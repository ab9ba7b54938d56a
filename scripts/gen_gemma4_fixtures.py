#!/usr/bin/env python3
"""Generate __test__/fixtures/gemma4-tiny/: a tiny random Gemma 4 text model, its GGUF as llama.cpp
writes one, greedy references with ablations, and PEFT experts on it; then gemma4-mm-tiny/: the same
text model inside a multimodal Gemma 4 checkpoint, with one LoRA expert.

Run:   python scripts/gen_gemma4_fixtures.py   (needs `npm install` for node-llama-cpp)
       python scripts/gen_gemma4_fixtures.py --multimodal-only   (only gemma4-mm-tiny/, from the
       gemma4-tiny/ on disk, which it does not touch; ~15 s)
       (any venv with scripts/requirements-fixtures.txt; written with torch 2.15.0,
       transformers 5.24.0, tokenizers 0.23.3, gguf 0.19.0, peft 0.21.2, node-llama-cpp 3.22.1
       -- ~/.cache/expert-runtime/bench-venv)

Seeded, single-threaded CPU, deterministic (a re-run reproduces every file byte for byte).
reference.json has granite-tiny's schema (__test__/fixtures/README.md); tokenizer, chat template
and prompt are gemma3-tiny's (shared BPE + <bos> 400, <start_of_turn> 401, <end_of_turn> 402;
Gemma 3's template, not Gemma 4's; "<bos>" + 24 ids, 16 new tokens, far past the window).
`Gemma4ForCausalLM` (model_type "gemma4_text"), eager, f32, tied embeddings; as modeling_gemma4.py
computes it (embeddings scaled by sqrt(64) = 8, GELU-tanh, sandwich norms as Gemma 3):

  * LAYER_TYPES [S, S, S, F, S, F] (S: sliding, window 6: a query sees itself and the 5 keys before
    it; F: full), hidden 64, 4 heads / 2 kv heads, head_dim 16 on S and 32 on F layers (config.json:
    per_layer_config {"3": {"head_dim": 32}, "5": ...}: transformers 5.24 turns global_head_dim into
    it and writes no global_head_dim). attention_k_eq_v False (num_global_key_value_heads applies
    only with it): 2 kv heads and a v_proj everywhere. Attention scaling 1.0; q and k are RMS-normed
    with weights (q_norm, k_norm), v without one (v_norm has no weight).
  * RoPE (NeoX, rotate_half): S default, theta 1e4, 8 frequencies over 16 dims; F "proportional",
    theta 1e6, partial_rotary_factor 0.25: inv_freq[i] = 1e6^(-2i/32) for i < 4 (exponent over the
    whole head_dim 32), 0 for i = 4..15, so only dims 0-3 and 16-19 rotate.
  * Gemma4RMSNorm is x * w (init 1; not Gemma 3's x * (1 + w)): w = gain + spread*randn (NORM_INIT:
    1 +- 0.3, post-attention / post-feedforward norms 3 +- 0.3, q_norm 0.35 +- 0.1).
    layer_scalar, a saved [1] buffer (init 1): 0.5 + U[0, 1); it multiplies the whole residual
    stream at the end of its layer (the last layer's reaches the output only through the eps).
  * Per-layer inputs (PLE), hidden_size_per_layer_input 8, vocab_size_per_layer_input 403, with
    e = embed_tokens[id] * 8: p = (per_layer_projection_norm(reshape(per_layer_model_projection(e)
    / 8, [6, 8])) + reshape(embed_tokens_per_layer[id] * sqrt(8), [6, 8])) / sqrt(2); after layer
    i's feed-forward residual h += post_per_layer_input_norm(per_layer_projection(gelu_tanh(
    per_layer_input_gate(h)) * p[i])), then h *= layer_scalar[i]. (The / 8 and / sqrt(2) only show
    through RMSNorm eps.)
  * num_kv_shared_layers 2: layers 4 (S) and 5 (F) have no k_proj / v_proj / k_norm; their q
    attends over the keys (k_norm'd, rotated) and values of the last earlier layer of their type
    (4 <- 2, 5 <- 3: reference.json "kv_shared_from"), with their own mask. use_double_wide_mlp:
    their MLP is 128 wide (64 elsewhere). final_logit_softcapping 30, no attention soft-cap, no MoE.
    Not the [S, S, F, S, S, F] first asked for: llama.cpp gives shared layer i the cache of layer
    n_kv - 2 (S) or n_kv - 1 (F), n_kv = 4 (src/llama-model.cpp), HF's choice only when the last
    non-shared layer is full and the one before it sliding; on [S, S, F, S, S, F] it aborts
    (GGML_ASSERT(map_layer_ids.find(il_reuse) ...), llama-kv-cache.cpp).
  * reference.json: f32 (checked against a full recompute), bf16, f16, "kv_shared_from", and
    "ablations": HF's greedy f32 run of the same weights with one thing changed --
    per_layer_inputs_off (every per_layer_projection zeroed: the branch adds
    post_per_layer_input_norm(0) = 0; hidden_size_per_layer_input 0 would drop weights),
    per_layer_embed_unscaled (no sqrt(8)), shared_layers_own_kv (layers 4 and 5 compute K/V from
    their own input with their producer's k_proj / v_proj / k_norm, the only such weights;
    num_kv_shared_layers 0 would add weights), full_rope_default (F layers: default RoPE over all
    32 dims), layer_scalar_1, no_final_softcap, window_ignored, window_5, window_7.
    Seed: the first from SEED whose 16 tokens pass sequence_ok (>= 6 distinct, no added token,
    top-1/top-2 gap >= 0.05) with no id more than 4 times, whose every ablation changes a token
    (no_final_softcap, monotone, a logprob by >= 0.01), and whose HF bf16 / f16 model stays within
    HALF_GAP_MAX of f32 (teacher-forced top-5 logprobs; at q_norm 1 the attention is so peaked
    that they drift by up to 2 / 0.4).
  * model-f32.gguf: "gemma4" as node-llama-cpp 3.22.1's llama.cpp converter (conversion/gemma.py
    Gemma4Model) writes it: gguf's tensor names (layer_scalar -> blk.N.layer_output_scale.weight,
    PLE -> per_layer_token_embd / per_layer_model_proj / per_layer_proj_norm, blk.N.inp_gate /
    proj / post_norm), norms as stored, no k / v tensors on blocks 4-5, rope_freqs.weight [16] =
    1 x 4, 1e30 x 12 (proportional RoPE as frequency factors on a 32-dim rotation); keys
    attention.key_length / value_length 32 and *_swa 16, rope.dimension_count 32 / _swa 16,
    rope.freq_base 1e6 / _swa 1e4, attention.sliding_window 6, sliding_window_pattern [bool x 6],
    attention.shared_kv_layers 2, embedding_length_per_layer_input 8, feed_forward_length
    [64 x 4, 128 x 2], final_logit_softcapping 30; gemma3-gguf-tiny's gpt2 tokenizer keys.
    "llamacpp": node-llama-cpp's greedy decode, which must give HF's tokens.
  * experts/: LoRA, DoRA, IA3 on the 7 projection names (gen_adapters.write_family_experts): PEFT
    adapts the 5 that layers 4 and 5 have, never per_layer_input_gate / per_layer_projection. No
    prompt tuning: HF's Gemma 4 finds the per-layer inputs of inputs_embeds by looking each row
    up in the embedding table and raises for PEFT's virtual tokens.

gemma4-mm-tiny/ (write_multimodal):
  * Gemma4ForConditionalGeneration (model_type "gemma4": text_config = gemma4-tiny's config.json
    less _name_or_path / architectures, vision_config, audio_config, placeholder ids 1000-1006 past
    the vocabulary), saved by save_pretrained: model.language_model.* (gemma4-tiny's model.*, every
    tensor checked equal as stored), model.vision_tower.*, model.audio_tower.*, model.embed_vision.*,
    model.embed_audio.*, no lm_head (tied). The towers are the smallest the configs build (MM_VISION,
    MM_AUDIO: 1 layer, hidden 16; ~45 KB), default-initialized from MM_SEED; the audio tower's
    Gemma4ClippableLinear saves input_min / input_max / output_min / output_max scalars (+-inf).
    Tokenizer and generation_config copied from gemma4-tiny.
  * reference.json: HF's greedy f32 run of this model on gemma4-tiny's prompt (text only), keys
    model / same_as ("gemma4-tiny") / seed (gemma4-tiny's) / prompt_ids / n_new / f32; the script
    requires gemma4-tiny's f32 tokens, logprobs and prefill log-softmax within 1e-5. Eager
    attention: sdpa moves the logits by ~1e-5.
  * experts/lora: FAMILY_EXPERTS' LoRA (r 4, alpha 8, init_lora_weights False, seeded randomize)
    on the 7 projection names. The list form raises in PEFT 0.21.2 (the towers' q_proj / ... are
    Gemma4ClippableLinear, not nn.Linear), so target_modules is MM_LORA_TARGETS, a regex: the
    language model's modules of those names plus the nn.Linear `.linear` inside the towers' ones
    (vision: 7, audio: q/k/v). 76 language-model tensors (layers 4-5 have no k / v) and 20 tower
    tensors (...vision_tower.encoder.layers.0.self_attn.q_proj.linear.lora_A.weight, ...).
    experts/reference.json: PEFT's greedy steps, cases "base" and "lora" (12 new tokens); base
    equals gemma4-tiny/experts' base within 1e-5.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from gguf import MODEL_ARCH, GGMLQuantizationType, get_tensor_name_map
from peft import PeftModel, get_peft_model
from safetensors import safe_open
from tokenizers import AddedToken, Tokenizer
from transformers import (AutoModelForCausalLM, Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration,
                          Gemma4TextConfig)
from transformers.models.gemma4.modeling_gemma4 import Gemma4RMSNorm, Gemma4TextRotaryEmbedding

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_adapters import FAMILY_EXPERTS, acceptable, describe_keys, randomize, reference, save_adapter  # noqa: E402
from gen_adapters import MAX_SEED_TRIES as EXPERT_SEED_TRIES, write_family_experts  # noqa: E402
from gen_fixtures import (build_tokenizer, check_recompute, dump_json, gguf_payload, greedy_reference,  # noqa: E402
                          new_gguf_writer, sequence_ok)
from gen_gemma3_fixtures import CHAT_TEMPLATE, GEMMA_SPECIALS, PROMPT_LEN, PROMPT_TEXT  # noqa: E402
from gen_gemma3_gguf_fixture import llamacpp_greedy  # noqa: E402
from gen_mistral_fixtures import reference_runs, save_model_dir  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "__test__" / "fixtures"
NAME = "gemma4-tiny"
N_NEW = 16
SEED = 11000
MAX_SEED_TRIES = 300
# RMSNorm weights: gain + spread * randn. Post-attention / post-feedforward 3 (else the sqrt(64)-scaled tied
# embedding dominates the residual and greedy decoding repeats a token, cf. gemma3-tiny); q_norm 0.35: with
# attention scaling 1.0 the q_norm weight sets the softmax temperature, and at 1 the attention is so peaked
# that HF's own bf16 / f16 runs drift from f32 by up to 2 / 0.4 in logprob.
NORM_INIT = {"post_attention_layernorm": (3.0, 0.3), "post_feedforward_layernorm": (3.0, 0.3), "q_norm": (0.35, 0.1)}
HALF_GAP_MAX = {torch.bfloat16: 0.25, torch.float16: 0.03}

S, F = "sliding_attention", "full_attention"
LAYER_TYPES = [S, S, S, F, S, F]
ROPE = {S: {"rope_type": "default", "rope_theta": 10000.0},
        F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}}
CFG = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=6, layer_types=LAYER_TYPES, sliding_window=6,
           num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32, attention_k_eq_v=False,
           rope_parameters=ROPE, hidden_size_per_layer_input=8, num_kv_shared_layers=2, use_double_wide_mlp=True,
           final_logit_softcapping=30.0, enable_moe_block=False, use_bidirectional_attention=None,
           hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
           max_position_embeddings=256, initializer_range=0.2, attention_bias=False, attention_dropout=0.0,
           use_cache=True)
KV_SHARED_FROM = [None, None, None, None, 2, 3]
HEAD_DIMS = [16, 16, 16, 32, 16, 32]


def build_model(seed: int, vocab_size: int, ids: dict, n_norms: int = 4 * 7 + 2 * 6 + 2,
                **overrides) -> Gemma4ForCausalLM:
    """CFG with `overrides`; every weighted RMSNorm (n_norms of them) perturbed by NORM_INIT, every
    layer_scalar 0.5 + U[0, 1) (gen_gemma4_moe_fixture.py passes its own config and count)."""
    config = Gemma4TextConfig(**copy.deepcopy({**CFG, **overrides}), vocab_size=vocab_size,
                              vocab_size_per_layer_input=vocab_size, pad_token_id=ids["<|endoftext|>"],
                              bos_token_id=ids["<bos>"], eos_token_id=[ids["<end_of_turn>"], ids["<|endoftext|>"]])
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        n = 0
        for name, mod in model.named_modules():
            if isinstance(mod, Gemma4RMSNorm) and mod.with_scale:  # v_norm has no weight
                assert torch.all(mod.weight == 1)  # Gemma 4 inits w = 1 (norm = x * w)
                gain, spread = NORM_INIT.get(name.rsplit(".", 1)[-1], (1.0, 0.3))
                mod.weight.copy_(gain + spread * torch.randn(mod.weight.shape, generator=gen))
                n += 1
        assert n == n_norms, n  # default: 5 layer norms + q_norm (+ k_norm) per layer, final, per_layer_projection
        for layer in model.model.layers:
            assert torch.equal(layer.layer_scalar, torch.ones(1))
            layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=gen))
    return model


def _cfg(**kw):
    def f(m):
        for k, v in kw.items():
            setattr(m.config, k, v)
    return f


def _window(w):
    def f(m):
        m.config.sliding_window = w  # the masks and the cache read the config
        for layer in m.model.layers:
            if layer.self_attn.is_sliding:
                layer.self_attn.sliding_window = w
    return f


def _ple_off(m):
    for layer in m.model.layers:
        layer.per_layer_projection.weight.zero_()


def _ple_unscaled(m):
    m.model.embed_tokens_per_layer.embed_scale.fill_(1.0)


def _own_kv(m):
    for i, p in enumerate(KV_SHARED_FROM):
        if p is not None:
            a, src = m.model.layers[i].self_attn, m.model.layers[p].self_attn
            for k in ("k_proj", "v_proj", "k_norm", "v_norm"):
                setattr(a, k, copy.deepcopy(getattr(src, k)))
            a.is_kv_shared_layer = False
    for layer in m.model.layers:
        layer.self_attn.store_full_length_kv = False
    m.config.num_kv_shared_layers = 0  # the cache gets a layer of its own for layers 4 and 5


def _full_rope_default(m):
    m.config.rope_parameters = {**ROPE, F: {"rope_type": "default", "rope_theta": 1e6}}
    m.model.rotary_emb = Gemma4TextRotaryEmbedding(m.config)


def _layer_scalar_1(m):
    for layer in m.model.layers:
        layer.layer_scalar.fill_(1.0)


ABLATIONS = {
    "per_layer_inputs_off": _ple_off, "per_layer_embed_unscaled": _ple_unscaled, "shared_layers_own_kv": _own_kv,
    "full_rope_default": _full_rope_default, "layer_scalar_1": _layer_scalar_1,
    "no_final_softcap": _cfg(final_logit_softcapping=None),
    "window_ignored": _window(4096), "window_5": _window(5), "window_7": _window(7),
}
MONOTONE = ("no_final_softcap",)


@torch.no_grad()
def ablation_runs(model, prompt_ids, ablations=None):
    out = {}
    for name, fn in (ablations or ABLATIONS).items():
        m = copy.deepcopy(model).eval()
        fn(m)
        r, _ = greedy_reference(m, prompt_ids, n_new=N_NEW)
        out[name] = {"tokens": [s["token"] for s in r["steps"]], "logprobs": [s["logprob"] for s in r["steps"]]}
    return out


def detectable(abl, steps) -> bool:
    toks = [s["token"] for s in steps]
    for k, a in abl.items():
        if k in MONOTONE:
            if a["tokens"] != toks or max(abs(x - s["logprob"]) for x, s in zip(a["logprobs"], steps)) < 0.01:
                return False
        elif a["tokens"] == toks:
            return False
    return True


@torch.no_grad()
def half_gaps(model, prompt_ids, steps):
    """HF's bf16 and f16 model against f32, teacher-forced along the f32 tokens: the largest top-5
    |dlogprob| (what an engine's half-precision run is held to, loosely)."""
    seq = prompt_ids + [s["token"] for s in steps]
    sl = slice(len(prompt_ids) - 1, len(seq) - 1)
    lp = {dt: torch.log_softmax(copy.deepcopy(model).to(dt)(input_ids=torch.tensor([seq]), use_cache=False)
                                .logits[0, sl].float(), -1) for dt in (torch.float32, *HALF_GAP_MAX)}
    top = lp[torch.float32].topk(5, -1).indices
    return {dt: float((lp[dt].gather(1, top) - lp[torch.float32].gather(1, top)).abs().max()) for dt in HALF_GAP_MAX}


def check_model(model, prompt_ids):
    """The semantics the docstring states, read back from HF's modules."""
    c, layers = model.config, model.model.layers
    first = c.num_hidden_layers - c.num_kv_shared_layers
    assert [l.self_attn.head_dim for l in layers] == HEAD_DIMS
    assert all(l.self_attn.scaling == 1.0 and l.self_attn.num_key_value_groups == 2 for l in layers)
    assert [l.self_attn.sliding_window for l in layers] == [6 if t == S else None for t in LAYER_TYPES]
    assert [l.mlp.intermediate_size for l in layers] == [64] * first + [128] * (6 - first)
    assert c.kv_sharing_modes == [None, None, "store", "store", "reuse", "reuse"]
    assert [max((j for j in range(first) if LAYER_TYPES[j] == LAYER_TYPES[i]), default=None) if i >= first else None
            for i in range(6)] == KV_SHARED_FROM
    assert all(not hasattr(layers[i].self_attn, "k_proj") for i in range(first, 6))
    m = model.model
    assert m.embed_tokens.scalar_embed_scale == 8.0 and m.embed_tokens_per_layer.scalar_embed_scale == 8 ** 0.5
    assert m.per_layer_input_scale == 2 ** -0.5 and m.per_layer_model_projection_scale == 1 / 8
    check_rope_window(model, prompt_ids)


def check_rope_window(model, prompt_ids):
    """RoPE frequencies (S: default over 16 dims; F: proportional, 4 of 16 pairs over 32 dims) and
    the window: a sliding layer's query q sees keys q-5..q, a full layer's every earlier key."""
    re = model.model.rotary_emb
    want = torch.cat([1e6 ** (-torch.arange(0, 8, 2) / 32), torch.zeros(12)])
    assert torch.allclose(re.full_attention_inv_freq, want)
    assert torch.allclose(re.sliding_attention_inv_freq, 1e4 ** (-torch.arange(0, 16, 2) / 16))
    with torch.no_grad():  # the window: a sliding layer's query q sees keys q-5..q (shared layer 4 too)
        att = model(input_ids=torch.tensor([prompt_ids]), use_cache=False, output_attentions=True).attentions
    d = torch.arange(len(prompt_ids))[:, None] - torch.arange(len(prompt_ids))[None, :]
    for t, a in zip(model.config.layer_types, att):
        assert torch.equal(a[0] > 0, ((d >= 0) & (d < 6) if t == S else d >= 0).expand_as(a[0])), t


def gguf_tensors(model):
    """(gguf name, f32 array), named as convert_hf_to_gguf.py's Gemma4Model names them."""
    tmap = get_tensor_name_map(MODEL_ARCH.GEMMA4, model.config.num_hidden_layers)
    ff = [1.0] * 4 + [1e30] * 12  # Gemma4Model.generate_extra_tensors: rotated pairs 1, the rest 1e30
    out = [("rope_freqs.weight", np.array(ff, dtype=np.float32))]
    for k, v in model.state_dict().items():
        if k == "lm_head.weight":  # tied
            continue
        hf = k + ".weight" if k.endswith("layer_scalar") or ".experts." in k else k  # Gemma4Model.filter_tensors
        if k.endswith(("router.scale", "router.per_expert_scale")):  # Gemma4Model.modify_tensors
            b = k.split(".")[2]
            g = f"blk.{b}.ffn_gate_inp.scale" if k.endswith("router.scale") else f"blk.{b}.ffn_down_exps.scale"
        else:
            g = tmap.get_name(hf, try_suffixes=(".weight",))
        assert g is not None, k
        out.append((g, np.ascontiguousarray(v.detach().to(torch.float32).numpy())))
    return out


def write_gguf(path: Path, model, tok_json: dict, ids: dict, name: str = NAME):
    """Keys as Gemma4Model.set_gguf_parameters writes them for c (gen_gemma4_moe_fixture.py: the
    per-layer kv head counts, expert keys, no double-wide MLP)."""
    c = model.config
    first = c.num_hidden_layers - c.num_kv_shared_layers
    kv = [c.per_layer_config[i].num_key_value_heads for i in range(c.num_hidden_layers)]
    w = new_gguf_writer(path, "gemma4", GGMLQuantizationType.F32, name, n_layer=c.num_hidden_layers,
                        n_ctx=c.max_position_embeddings, n_embd=c.hidden_size, n_ff=c.intermediate_size,
                        n_head=c.num_attention_heads, n_kv=c.to_dict()["num_key_value_heads"], head_dim=max(HEAD_DIMS),
                        rope_theta=ROPE[F]["rope_theta"], rms_eps=c.rms_norm_eps, vocab_size=c.vocab_size,
                        tok_json=tok_json, eos_id=ids["<end_of_turn>"], pad_id=ids["<|endoftext|>"],
                        bos_id=ids["<bos>"], chat_template=CHAT_TEMPLATE)
    w.add_rope_freq_base_swa(ROPE[S]["rope_theta"])
    w.add_final_logit_softcapping(c.final_logit_softcapping)
    w.add_sliding_window(c.sliding_window)
    w.add_shared_kv_layers(c.num_kv_shared_layers)
    w.add_embedding_length_per_layer_input(c.hidden_size_per_layer_input)
    w.add_sliding_window_pattern([t == S for t in c.layer_types])
    w.add_key_length_swa(min(HEAD_DIMS))
    w.add_value_length_swa(min(HEAD_DIMS))
    if c.enable_moe_block:
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.top_k_experts)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    if c.use_double_wide_mlp:
        w.add_feed_forward_length([c.intermediate_size * (2 if i >= first else 1) for i in range(c.num_hidden_layers)])
    if len(set(kv)) > 1:  # num_global_key_value_heads (attention_k_eq_v)
        w.add_head_count_kv(kv)
    w.add_rope_dimension_count(max(HEAD_DIMS))  # "proportional": the whole head, see rope_freqs
    w.add_rope_dimension_count_swa(min(HEAD_DIMS))
    names = []
    for g, arr in gguf_tensors(model):
        data, raw_dtype = gguf_payload(arr, GGMLQuantizationType.F32)
        w.add_tensor(g, data, raw_shape=None, raw_dtype=raw_dtype)
        names.append(g)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return names


def gemma_tokenizer():
    """gemma3-tiny's tokenizer, ids of its added tokens, prompt and tokenizer_config."""
    tok = build_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GEMMA_SPECIALS])
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    ids = {tok.id_to_token(i): i for i in range(395, vocab_size)}
    prompt_ids = tok.encode(PROMPT_TEXT).ids
    assert len(prompt_ids) == PROMPT_LEN and prompt_ids[0] == ids["<bos>"] and vocab_size == 403, prompt_ids
    bad = list(ids.values())
    tokenizer_config = json.loads((OUT / "gemma3-tiny" / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == CHAT_TEMPLATE
    return tok, vocab_size, ids, prompt_ids, bad, tokenizer_config


def save_gemma_dir(out: Path, model, tok, tokenizer_config: dict, ids: dict, ref: dict):
    save_model_dir(out, model, tok, tokenizer_config, ids, ref)
    dump_json(out / "generation_config.json",
              {"bos_token_id": ids["<bos>"], "eos_token_id": [ids["<end_of_turn>"], ids["<|endoftext|>"]],
               "pad_token_id": ids["<|endoftext|>"], "transformers_version": transformers.__version__}, sort_keys=True)


def write_text_fixture():
    np.random.seed(0)
    tok, vocab_size, ids, prompt_ids, bad, tokenizer_config = gemma_tokenizer()

    for seed in range(SEED, SEED + MAX_SEED_TRIES):
        model = build_model(seed, vocab_size, ids)
        f32, m32 = greedy_reference(model, prompt_ids, full_prefill=True)
        toks = [s["token"] for s in f32["steps"]]
        ok = sequence_ok(f32["steps"], m32, bad) and max(toks.count(t) for t in toks) <= 4
        if ok:
            gaps = half_gaps(model, prompt_ids, f32["steps"])
            ok = all(gaps[dt] <= HALF_GAP_MAX[dt] for dt in gaps)
        if ok:
            abl = ablation_runs(model, prompt_ids)
            ok = detectable(abl, f32["steps"])
        if ok:
            break
    else:
        raise SystemExit("no acceptable seed found")
    check_model(model, prompt_ids)
    print(f"{NAME}: seed={seed} tokens={toks} min margin={min(m32):.4f} layer_scalar="
          f"{[round(float(l.layer_scalar), 4) for l in model.model.layers]} half-precision gaps "
          f"{', '.join(f'{dt}: {g:.3f}' for dt, g in gaps.items())}")
    for k, a in abl.items():
        d = [i for i, (x, y) in enumerate(zip(a["tokens"], toks)) if x != y]
        lp = max(abs(x - s["logprob"]) for x, s in zip(a["logprobs"], f32["steps"]))
        print(f"  ablation {k}: {len(d)}/{N_NEW} tokens differ" + (f" (first at {d[0]})" if d else "")
              + f", max |dlogprob| {lp:.3f}")

    ref = reference_runs(model, tok, NAME, seed, prompt_ids, f32)
    ref["prompt_text"] = PROMPT_TEXT
    ref["kv_shared_from"] = KV_SHARED_FROM
    ref["ablations"] = {"prompt": "prompt_ids", "n_new": N_NEW, "f32": abl}
    out = OUT / NAME
    save_gemma_dir(out, model, tok, tokenizer_config, ids, ref)

    cfg = json.loads((out / "config.json").read_text())
    print(f"  config.json: {json.dumps(cfg)}")
    assert cfg["model_type"] == "gemma4_text" and cfg["architectures"] == ["Gemma4ForCausalLM"], cfg
    assert "global_head_dim" not in cfg and cfg["per_layer_config"] == {"3": {"head_dim": 32}, "5": {"head_dim": 32}}
    assert cfg["rope_parameters"] == ROPE and cfg["layer_types"] == LAYER_TYPES and cfg["head_dim"] == 16
    with safe_open(out / "model.safetensors", "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    print("  model.safetensors: " + ", ".join(f"{k} {v}" for k, v in shapes.items()))
    assert shapes["model.layers.0.layer_scalar"] == [1] and "lm_head.weight" not in shapes
    assert not [k for k in shapes if k.startswith(("model.layers.4.self_attn.k", "model.layers.4.self_attn.v",
                                                   "model.layers.5.self_attn.k", "model.layers.5.self_attn.v"))]
    m = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    r, _ = greedy_reference(m, prompt_ids)
    assert [s["token"] for s in r["steps"]] == toks
    assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(r["steps"], f32["steps"])) < 1e-4
    print("  reload OK")

    gguf_path = out / "model-f32.gguf"
    names = write_gguf(gguf_path, model, json.loads(tok.to_str()), ids)
    print(f"  model-f32.gguf: {len(names)} tensors: {', '.join(names)}")
    ll = llamacpp_greedy(gguf_path, prompt_ids, N_NEW)
    assert ll["tokens"] == toks, f"llama.cpp decodes the GGUF otherwise: {ll['tokens']} vs HF {toks}"
    worst = max(abs(a - s["logprob"]) for a, s in zip(ll["logprobs"], f32["steps"]))
    print(f"  llama.cpp on model-f32.gguf: the same {N_NEW} tokens, max |dlogprob| vs HF {worst:.2e}")
    ref["llamacpp"] = ll
    dump_json(out / "reference.json", ref, compact_lists=True)

    write_family_experts(out, NAME, prompt_ids, kinds=("lora", "dora", "ia3"))
    for kind in ("lora", "dora", "ia3"):
        keys = describe_keys(out / "experts" / kind)
        p = "base_model.model.model.layers."
        print(f"  {kind}: {len(keys)} tensors; layer 4: " + ", ".join(
            f"{k.removeprefix(p + '4.')} {v}" for k, v in sorted(keys.items()) if k.startswith(p + "4.")))
        assert not [k for k in keys if k.startswith((p + "4.self_attn.k", p + "4.self_attn.v", p + "5.self_attn.k",
                                                      p + "5.self_attn.v")) or "per_layer" in k]
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"  {out.relative_to(ROOT)} {total / 1e3:.0f} KB")



# ---- gemma4-mm-tiny: gemma4-tiny's text model inside a multimodal Gemma 4 checkpoint ----
MM_NAME = "gemma4-mm-tiny"
MM_SEED = 12000  # torch seed of the (default-initialized) vision / audio towers and embedders
# The smallest towers Gemma4VisionConfig / Gemma4AudioConfig build: 1 layer, hidden 16, 2 heads
# (vision head_dim 8: the axial RoPE splits it in 4), a 2x2 patch, 8 positions per axis, no pooling;
# audio 4-channel subsampling convs, a 2-tap depthwise conv, output_proj_dims 16 (default 1536).
MM_VISION = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=2, head_dim=8, patch_size=2, position_embedding_size=8, pooling_kernel_size=1)
MM_AUDIO = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[4, 4],
                conv_kernel_size=2, output_proj_dims=16)
# Placeholder ids past the 403-token vocabulary (transformers maps them to pad before the text embedding):
# no text prompt contains them.
MM_TOKEN_IDS = dict(boi_token_id=1000, eoi_token_id=1001, image_token_id=1002, video_token_id=1003,
                    boa_token_id=1004, eoa_token_index=1005, audio_token_id=1006)
# The 7 projection names, by regex: the list ["q_proj", ...] makes PEFT 0.21.2 raise, as the towers'
# q_proj / ... are Gemma4ClippableLinear (an nn.Linear in `.linear`), which LoRA does not support.
# So: the language model's modules of those names, and the `.linear` inside the towers' ones.
_P7 = "q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj"
MM_LORA_TARGETS = rf".*\.language_model\..*\.({_P7})|.*_tower\..*\.({_P7})\.linear"


def load_multimodal(path: Path) -> Gemma4ForConditionalGeneration:
    return Gemma4ForConditionalGeneration.from_pretrained(path, dtype=torch.float32,
                                                          attn_implementation="eager").eval()


def same_steps(a, b, tol=1e-5):
    assert [s["token"] for s in a] == [s["token"] for s in b], ([s["token"] for s in a], [s["token"] for s in b])
    worst = max(abs(x["logprob"] - y["logprob"]) for x, y in zip(a, b))
    assert worst < tol, worst
    return worst


def tensor_prefixes(keys, depth):
    out = {}
    for k in keys:
        p = ".".join(k.split(".")[:depth])
        out[p] = out.get(p, 0) + 1
    return out


def write_multimodal():
    src, out = OUT / NAME, OUT / MM_NAME
    src_ref = json.loads((src / "reference.json").read_text())
    prompt_ids, n_new = src_ref["prompt_ids"], src_ref["n_new"]
    text = Gemma4ForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager").eval()

    text_config = text.config.to_dict()
    for k in ("_name_or_path", "architectures"):  # where this script loaded it from, not the model's
        text_config.pop(k)
    cfg = Gemma4Config(text_config=text_config, vision_config=MM_VISION, audio_config=MM_AUDIO,
                       **MM_TOKEN_IDS)
    torch.manual_seed(MM_SEED)
    mm = Gemma4ForConditionalGeneration(cfg).to(torch.float32).eval()
    with torch.no_grad():
        r = mm.model.language_model.load_state_dict(text.model.state_dict(), strict=True)
        assert not r.missing_keys and not r.unexpected_keys, r
    mm.config._attn_implementation = "eager"  # else sdpa: logits differ from gemma4-tiny's by ~1e-5
    mm.config.text_config._attn_implementation = "eager"
    assert mm.lm_head.weight.data_ptr() == mm.model.language_model.embed_tokens.weight.data_ptr()
    lm, tm = mm.model.language_model.state_dict(), text.model.state_dict()
    assert lm.keys() == tm.keys() and all(torch.equal(lm[k], tm[k]) for k in tm)

    f32, _ = greedy_reference(mm, prompt_ids, n_new=n_new, full_prefill=True)
    worst = same_steps(f32["steps"], src_ref["f32"]["steps"])
    pre = max(abs(a - b) for a, b in zip(f32["prefill_logprobs"], src_ref["f32"]["prefill_logprobs"]))
    assert pre < 1e-5, pre
    assert check_recompute(mm, prompt_ids, f32["steps"]) < 1e-4
    f32["generated_text"] = Tokenizer.from_file(str(src / "tokenizer.json")).decode(
        [s["token"] for s in f32["steps"]], skip_special_tokens=False)
    assert f32["generated_text"] == src_ref["f32"]["generated_text"]
    print(f"{MM_NAME}: HF's greedy decode = {NAME}'s f32 reference (max |dlogprob| {worst:.2e}, "
          f"prefill {pre:.2e})")

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    mm.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):  # the last as gemma3-mm-tiny
        shutil.copy(src / f, out / f)
    dump_json(out / "reference.json", {"model": MM_NAME, "same_as": NAME, "seed": src_ref["seed"],
                                       "prompt_ids": prompt_ids, "n_new": n_new, "f32": f32}, compact_lists=True)

    config = json.loads((out / "config.json").read_text())
    print(f"  config.json: {json.dumps(config)}")
    assert config["model_type"] == "gemma4" and config["architectures"] == ["Gemma4ForConditionalGeneration"]
    assert config["text_config"]["model_type"] == "gemma4_text"
    print(f"  config.json top-level keys: {sorted(config)}")
    print(f"  text_config keys: {sorted(config['text_config'])}")
    assert not (out / "model.safetensors.index.json").exists()
    with safe_open(out / "model.safetensors", "pt") as f, safe_open(src / "model.safetensors", "pt") as g:
        keys = list(f.keys())
        text_keys = list(g.keys())
        for k in text_keys:  # every text tensor, as stored, byte for byte the same
            assert k.startswith("model.") and torch.equal(f.get_tensor("model.language_model." + k[6:]),
                                                          g.get_tensor(k)), k
        n_text = sum(k.startswith("model.language_model.") for k in keys)
        assert n_text == len(text_keys), (n_text, len(text_keys))
        nbytes = {}
        for k in keys:
            p = ".".join(k.split(".")[:2])
            nbytes[p] = nbytes.get(p, 0) + f.get_tensor(k).numel() * f.get_tensor(k).element_size()
    print(f"  model.safetensors: {len(keys)} tensors; " + ", ".join(
        f"{p}.* {n} ({nbytes[p] / 1e3:.1f} KB)" for p, n in tensor_prefixes(keys, 2).items()))
    print("  towers: " + ", ".join(f"{k}" for k in keys if not k.startswith("model.language_model.")))

    base_steps, _ = reference(load_multimodal(out), prompt_ids)
    reloaded, _ = greedy_reference(load_multimodal(out), prompt_ids, n_new=n_new)
    same_steps(reloaded["steps"], f32["steps"])  # a fresh load decodes within ~7e-6 (run-to-run noise)
    src_experts = json.loads((src / "experts" / "reference.json").read_text())["cases"]["base"]["steps"]
    same_steps(base_steps, src_experts)
    cases = {"base": {"experts": [], "prompt_ids": prompt_ids, "steps": base_steps}}
    spec = next(s for s in FAMILY_EXPERTS if s["name"] == "lora")
    for seed in range(spec["seed"], spec["seed"] + EXPERT_SEED_TRIES):
        torch.manual_seed(seed)
        pm = get_peft_model(load_multimodal(out), spec["cfg"](MM_LORA_TARGETS, []))
        randomize(pm, seed)
        steps, margin = reference(pm.eval(), prompt_ids)
        ok, n_diff = acceptable(steps, margin, base_steps)
        if ok:
            break
    else:
        raise SystemExit("gemma4-mm-tiny lora: no acceptable seed")
    d = out / "experts" / "lora"
    save_adapter(pm, d, MM_NAME)
    cases["lora"] = {"experts": ["lora"], "seed": seed, "prompt_ids": prompt_ids, "steps": steps}
    again, _ = reference(PeftModel.from_pretrained(load_multimodal(out), d).eval(), prompt_ids)
    same_steps(again, steps)
    dump_json(out / "experts" / "reference.json", {"model": MM_NAME, "cases": cases}, compact_lists=True)
    akeys = describe_keys(d)
    n_lm = sum(".language_model." in k for k in akeys)
    print(f"  expert lora: seed {seed}, {n_diff}/{len(steps)} tokens differ from the base, min margin {margin:.3f}; "
          f"{len(akeys)} tensors: " + ", ".join(f"{p}.* {n}" for p, n in tensor_prefixes(akeys, 4).items()))
    print(f"    {n_lm} language-model tensors, {len(akeys) - n_lm} tower tensors: " + ", ".join(
        k for k in akeys if ".language_model." not in k))
    assert n_lm == 2 * (4 * 7 + 2 * 5), n_lm  # layers 4 and 5 have no k_proj / v_proj
    assert all(".language_model." in k or "_tower." in k for k in akeys)
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"  {out.relative_to(ROOT)} {total / 1e3:.0f} KB: " + ", ".join(
        f"{f.relative_to(out)} {f.stat().st_size}" for f in sorted(out.rglob("*")) if f.is_file()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--multimodal-only", action="store_true",
                    help=f"write only {MM_NAME}/ (from the {NAME}/ on disk, which stays untouched)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if not args.multimodal_only:
        write_text_fixture()
    write_multimodal()


if __name__ == "__main__":
    main()
