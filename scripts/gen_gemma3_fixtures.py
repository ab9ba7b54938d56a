#!/usr/bin/env python3
"""Generate __test__/fixtures/gemma3-tiny/: a tiny random Gemma 3 text model + greedy references.

Run:   python scripts/gen_gemma3_fixtures.py
       (any venv with scripts/requirements-fixtures.txt; written with torch 2.15.0,
       transformers 5.24.0, tokenizers 0.23.3, gguf 0.19.0 -- ~/.cache/expert-runtime/bench-venv)

Seeded, single-threaded CPU, deterministic. Same layout and reference.json schema as
qwen3-tiny (see __test__/fixtures/README.md), built with HF `Gemma3ForCausalLM`
(model_type "gemma3_text", eager attention, f32):

  * 4 layers, layer_types [sliding, sliding, full, sliding], sliding_window 8;
    4 heads / 2 kv heads, head_dim 32, query_pre_attn_scalar 24 (!= head_dim);
    rope theta 1e6 (full layers) / 1e4 (sliding layers); final_logit_softcapping 30;
    gelu_pytorch_tanh; tied embeddings (HF scales them by sqrt(hidden) = 8 on input only).
  * every Gemma RMSNorm weight w (applied as x*(1+w)) = 0.3*randn, incl. q_norm / k_norm, except
    post_attention_layernorm / post_feedforward_layernorm: 2 + 0.3*randn (see POST_NORM_OFFSET).
  * tokenizer = the shared tiny BPE of gen_fixtures.py plus three added special tokens
    <bos>=400, <start_of_turn>=401, <end_of_turn>=402 (vocab 403), and Gemma 3's real chat
    template (text parts only): no system role, a system message is prepended to the first
    user turn. No automatic BOS (add_bos_token false): the reference prompts spell "<bos>".
  * reference.json: the 25-token prompt (<bos> + 24) with n_new 16 crosses the 8-token
    window; "prompt_short" (4 tokens, 4 new) never leaves it. "ablations" records the greedy
    tokens + logprobs of deliberately wrong variants (window ignored / off by one,
    1/sqrt(head_dim) scaling, no softcap, no embedding scale, norms without +1, local rope
    base = global): the seed is chosen so that each of them changes at least one token (the
    softcap, being monotone, only the logprobs, by >= 0.01).
  * config.json is as transformers 5.24 writes it: rope_parameters keyed by layer type, and a
    stray "_sliding_window_pattern": 6 (Gemma3TextConfig's private default) that layer_types overrides.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import AddedToken
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_fixtures import (ADDED_TOKENS, SPECIAL_TOKENS, build_tokenizer, check_recompute,  # noqa: E402
                          dump_json, greedy_reference, sequence_ok)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "__test__" / "fixtures" / "gemma3-tiny"
NAME = "gemma3-tiny"

GEMMA_SPECIALS = ["<bos>", "<start_of_turn>", "<end_of_turn>"]

# Gemma 3's chat template (google/gemma-3-*-it tokenizer_config.json) without the image branch.
CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)

PROMPT_TEXT = "<bos>Once upon a time a little robot read 日本 signs."
PROMPT_LEN = 25            # <bos> + 24 text tokens; > 3 x the window
SHORT_TEXT = "<bos>The robot"
SHORT_LEN, SHORT_NEW = 4, 4
N_NEW = 16
BASE_SEED = 5000
MAX_SEED_TRIES = 300
# With tied embeddings scaled by sqrt(64) = 8 and every sub-layer output RMS-normed to ~1 before the
# residual add, the residual stream stays dominated by the current token's embedding, so the tied LM
# head favours the current token and greedy decoding repeats it (16 x the same id for most seeds).
# Post-attention / post-feedforward norm gains of ~3 (w = 2 + 0.3*randn) give varied outputs.
POST_NORM_OFFSET = 2.0

CFG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
           layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
           sliding_window=8, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
           query_pre_attn_scalar=24,
           rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
           final_logit_softcapping=30.0, attn_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh",
           rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=256,
           initializer_range=0.2, attention_bias=False, attention_dropout=0.0, use_cache=True,
           use_bidirectional_attention=False)

CHAT_SAMPLES = [
    dict(messages=[{"role": "user", "content": "Hello!"}], add_generation_prompt=True),
    dict(messages=[{"role": "system", "content": "You are terse."},
                   {"role": "user", "content": "What is 6 times 7?"},
                   {"role": "assistant", "content": "42"},
                   {"role": "user", "content": "And 日本?"}], add_generation_prompt=True),
]


def build_model(seed: int, vocab_size: int, ids: dict, cfg: dict | None = None) -> Gemma3ForCausalLM:
    """The seeded random model of `cfg` (default CFG, whose layout is checked)."""
    config = Gemma3TextConfig(**copy.deepcopy(cfg or CFG), vocab_size=vocab_size, pad_token_id=ids["<|endoftext|>"],
                              bos_token_id=ids["<bos>"],
                              eos_token_id=[ids["<end_of_turn>"], ids["<|endoftext|>"]])
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        n = 0
        for name, mod in model.named_modules():
            if type(mod).__name__.endswith("RMSNorm"):
                assert torch.all(mod.weight == 0)  # Gemma inits w = 0 (norm = x * (1 + w))
                off = POST_NORM_OFFSET if name.endswith(("post_attention_layernorm", "post_feedforward_layernorm")) else 0.0
                mod.weight.copy_(off + 0.3 * torch.randn(mod.weight.shape, generator=gen))
                n += 1
        assert n == config.num_hidden_layers * 6 + 1, n  # 4 layer norms + q_norm + k_norm per layer, final norm
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if cfg is None:
        assert [l.self_attn.sliding_window for l in model.model.layers] == [8, 8, None, 8]
        assert all(abs(l.self_attn.scaling - 24 ** -0.5) < 1e-12 for l in model.model.layers)
    return model


# --- deliberately wrong variants: what an engine with one specific bug would produce ---
def _set_cfg(key, value):
    def f(m):
        setattr(m.config, key, value)
    return f


def _scale_head_dim(m):
    for layer in m.model.layers:
        layer.self_attn.scaling = m.config.head_dim ** -0.5


def _no_embed_scale(m):
    m.model.embed_tokens.embed_scale.fill_(1.0)


def _norm_without_plus1(m):
    for mod in m.modules():
        if type(mod).__name__.endswith("RMSNorm"):
            mod.weight.sub_(1.0)  # x * (1 + (w - 1)) = x * w


def _local_rope_global(m):
    re = m.model.rotary_emb
    re.sliding_attention_inv_freq.copy_(re.full_attention_inv_freq)


ABLATIONS = {
    "window_ignored": _set_cfg("sliding_window", 4096),       # sliding layers attend to everything
    "window_inclusive_9": _set_cfg("sliding_window", 9),      # q attends q-8..q (one too many)
    "window_7": _set_cfg("sliding_window", 7),                # q attends q-6..q (one too few)
    "scale_head_dim": _scale_head_dim,                        # 1/sqrt(head_dim) instead of 1/sqrt(24)
    "no_final_softcap": _set_cfg("final_logit_softcapping", None),
    "no_embed_scale": _no_embed_scale,                        # embeddings not multiplied by sqrt(64)
    "norm_without_plus1": _norm_without_plus1,                # x*w instead of x*(1+w)
    "local_rope_base_1e6": _local_rope_global,                # sliding layers with the global theta
}


@torch.no_grad()
def ablation_runs(model, prompt_ids):
    """{name: {"tokens": [...], "logprobs": [...]}} of the greedy decode of each wrong variant."""
    out = {}
    for name, fn in ABLATIONS.items():
        m = copy.deepcopy(model).eval()
        fn(m)
        r, _ = greedy_reference(m, prompt_ids, n_new=N_NEW)
        out[name] = {"tokens": [s["token"] for s in r["steps"]], "logprobs": [s["logprob"] for s in r["steps"]]}
    return out


def ablations_detectable(abl, steps) -> bool:
    """Every wrong variant changes the greedy tokens -- except the softcap, a monotone map that
    cannot change an argmax: it must keep the tokens and move the logprobs by >= 0.01."""
    toks = [s["token"] for s in steps]
    for name, a in abl.items():
        if name == "no_final_softcap":
            assert a["tokens"] == toks
            if max(abs(x - s["logprob"]) for x, s in zip(a["logprobs"], steps)) < 0.01:
                return False
        elif a["tokens"] == toks:
            return False
    return True


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    np.random.seed(0)

    tok = build_tokenizer()
    assert tok.get_vocab_size(with_added_tokens=True) == 400
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GEMMA_SPECIALS])
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    all_added = SPECIAL_TOKENS + ADDED_TOKENS + GEMMA_SPECIALS
    ids = {t: tok.token_to_id(t) for t in all_added}
    assert [ids[t] for t in GEMMA_SPECIALS] == [400, 401, 402] and vocab_size == 403, (ids, vocab_size)
    tok_json_str = tok.to_str(pretty=True)
    bad = [ids[t] for t in all_added]

    enc = tok.encode(PROMPT_TEXT)
    prompt_ids = enc.ids
    assert len(prompt_ids) == PROMPT_LEN and prompt_ids[0] == ids["<bos>"], (len(prompt_ids), enc.tokens)
    assert tok.decode(prompt_ids, skip_special_tokens=False) == PROMPT_TEXT
    short_ids = tok.encode(SHORT_TEXT).ids
    assert len(short_ids) == SHORT_LEN and short_ids[0] == ids["<bos>"], short_ids
    print(f"tokenizer: vocab={vocab_size} gemma ids={[ids[t] for t in GEMMA_SPECIALS]} prompt={len(prompt_ids)} "
          f"tokens, short={short_ids}")

    # ---- first seed whose greedy outputs are varied, not near-tied, and changed by every ablation ----
    seed = BASE_SEED
    for attempt in range(MAX_SEED_TRIES):
        model = build_model(seed, vocab_size, ids)
        f32, m32 = greedy_reference(model, prompt_ids, full_prefill=True)
        toks = [s["token"] for s in f32["steps"]]
        ok = sequence_ok(f32["steps"], m32, bad) and max(toks.count(t) for t in toks) <= 4
        if ok:
            sh, msh = greedy_reference(model, short_ids, n_new=SHORT_NEW, full_prefill=True)
            ok = sequence_ok(sh["steps"], msh, bad, min_distinct=2)
        if ok:
            abl = ablation_runs(model, prompt_ids)
            ok = ablations_detectable(abl, f32["steps"])
        if ok:
            break
        seed += 1
    else:
        raise SystemExit("no acceptable seed found")
    print(f"{NAME}: seed={seed} (attempt {attempt}) f32 tokens={toks} min margin={min(m32):.4f}")
    for k, v in abl.items():
        d = [i for i, (a, b) in enumerate(zip(v["tokens"], toks)) if a != b]
        dlp = max(abs(x - s["logprob"]) for x, s in zip(v["logprobs"], f32["steps"]))
        print(f"  ablation {k}: {len(d)}/{N_NEW} tokens differ (first at {d[0] if d else None}), "
              f"max |dlogprob| {dlp:.3f}")

    # cached decode (DynamicSlidingWindowLayer keeps only the last window-1 keys) == full recompute
    worst = check_recompute(model, prompt_ids, f32["steps"])
    assert worst < 1e-4, worst
    worst_s = check_recompute(model, short_ids, sh["steps"])
    assert worst_s < 1e-4, worst_s
    print(f"  cached vs full recompute: max |dlogprob| {worst:.2e} (long), {worst_s:.2e} (short)")

    # the window HF applies: a sliding layer's query q sees keys q-7..q (8 positions, itself included)
    with torch.no_grad():
        att = model(input_ids=torch.tensor([prompt_ids]), use_cache=False, output_attentions=True).attentions
    d = torch.arange(PROMPT_LEN)[:, None] - torch.arange(PROMPT_LEN)[None, :]
    for lt, a in zip(CFG["layer_types"], att):
        want = (d >= 0) & (d < CFG["sliding_window"]) if lt == "sliding_attention" else d >= 0
        assert torch.equal(a[0] > 0, want.expand_as(a[0])), lt

    dec = lambda r: tok.decode([s["token"] for s in r["steps"]], skip_special_tokens=False)  # noqa: E731
    f32["generated_text"] = dec(f32)
    sh["generated_text"] = dec(sh)
    ref = {"model": NAME, "seed": seed, "prompt_text": PROMPT_TEXT, "prompt_ids": prompt_ids, "n_new": N_NEW,
           "f32": f32}
    for key, dt in (("bf16", torch.bfloat16), ("f16", torch.float16)):
        mh = copy.deepcopy(model).to(dt).eval()
        r, mm = greedy_reference(mh, prompt_ids)
        r["generated_text"] = dec(r)
        ref[key] = r
        agree = sum(a["token"] == b["token"] for a, b in zip(r["steps"], f32["steps"]))
        print(f"  {key}: agrees with f32 on {agree}/{N_NEW} steps, min margin={min(mm):.4f}")
    ref["prompt_short"] = {"prompt_text": SHORT_TEXT, "prompt_ids": short_ids, "n_new": SHORT_NEW, "f32": sh}
    ref["ablations"] = {"prompt": "prompt_ids", "n_new": N_NEW, "f32": abl}

    # ---- save ----
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    model.save_pretrained(OUT, safe_serialization=True)
    assert (OUT / "model.safetensors").exists()
    (OUT / "tokenizer.json").write_text(tok_json_str, encoding="utf-8")
    tokenizer_config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": t not in ADDED_TOKENS}
            for t in all_added
        },
        "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"],
        "bos_token": "<bos>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<end_of_turn>",
        "errors": "replace",
        "model_max_length": 256,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    dump_json(OUT / "tokenizer_config.json", tokenizer_config)
    gen_cfg = {"bos_token_id": ids["<bos>"], "eos_token_id": [ids["<end_of_turn>"], ids["<|endoftext|>"]],
               "pad_token_id": ids["<|endoftext|>"], "transformers_version": transformers.__version__}
    dump_json(OUT / "generation_config.json", gen_cfg, sort_keys=True)

    # chat template rendered by transformers' Jinja (system folded into the first user turn)
    hf = AutoTokenizer.from_pretrained(OUT)
    assert hf(PROMPT_TEXT, add_special_tokens=True)["input_ids"] == prompt_ids  # no automatic BOS
    chats = []
    for c in CHAT_SAMPLES:
        kw = {k: v for k, v in c.items() if k != "messages"}
        text = hf.apply_chat_template(c["messages"], tokenize=False, **kw)
        assert text.startswith("<bos><start_of_turn>user\n") and "<start_of_turn>system" not in text, text
        chat_ids = tok.encode(text).ids
        assert hf(text, add_special_tokens=False)["input_ids"] == chat_ids
        chats.append({**c, "text": text, "ids": chat_ids})
    assert chats[1]["text"].startswith("<bos><start_of_turn>user\nYou are terse.\n\nWhat is 6 times 7?<end_of_turn>\n")
    ref["chat"] = chats
    dump_json(OUT / "reference.json", ref, compact_lists=True)

    # ---- reload round trip ----
    cfg = json.loads((OUT / "config.json").read_text())
    assert cfg["model_type"] == "gemma3_text" and cfg["architectures"] == ["Gemma3ForCausalLM"], cfg
    m = AutoModelForCausalLM.from_pretrained(OUT, dtype=torch.float32, attn_implementation="eager").eval()
    for pids, r0 in ((prompt_ids, f32), (short_ids, sh)):
        r, _ = greedy_reference(m, pids, n_new=len(r0["steps"]))
        assert [s["token"] for s in r["steps"]] == [s["token"] for s in r0["steps"]]
        assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(r["steps"], r0["steps"])) < 1e-5
    print("reload check OK; config.json rope form:", json.dumps(cfg.get("rope_parameters")))
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"{OUT.relative_to(ROOT)}: " + ", ".join(f"{p.name} {p.stat().st_size}" for p in sorted(OUT.iterdir()))
          + f"; total {total / 1e3:.0f} KB")


# --------------------------------------------------------------------------------------
# GGUF: not written for this model (its layout cannot be; see below): scripts/gen_gemma3_gguf_fixture.py
# writes gemma3-gguf-tiny, a model in the layout llama.cpp fixes. How llama.cpp stores one -- convert_hf_to_gguf.py
# (ggml-org/llama.cpp, conversion/gemma.py `Gemma3Model`, registered for Gemma3ForCausalLM and
# Gemma3ForConditionalGeneration) and the gguf package (gguf 0.19.0 constants.py /
# tensor_mapping.py / gguf_writer.py):
#   * general.architecture "gemma3" (MODEL_ARCH.GEMMA3).
#   * keys: gemma3.context_length, .embedding_length, .block_count, .feed_forward_length,
#     .attention.head_count, .attention.head_count_kv, .attention.key_length = .value_length =
#     head_dim, .attention.layer_norm_rms_epsilon, .rope.freq_base = rope_parameters
#     ["full_attention"]["rope_theta"] (global layers only), .final_logit_softcapping (only if
#     set), .attention.sliding_window (unless sliding_window_pattern == 1). The converter asserts
#     attn_logit_softcapping is None. NOT written: the local rope base, query_pre_attn_scalar,
#     layer_types -- llama.cpp's loader hard-codes them: rope_freq_base_train_swa = 10000,
#     set_swa_pattern(6) (layer il is sliding iff il % 6 < 5, i.e. 5 sliding + 1 full), and
#     f_attention_scale = 1/sqrt(head_dim) (27B: 1/sqrt(n_embd/n_head)). So this fixture's
#     [S,S,F,S] layout and scalar 24 are NOT representable in a llama.cpp-faithful GGUF; a
#     GGUF of it would need extra keys, e.g. gemma3.attention.sliding_window_pattern as a
#     bool array (GGUFWriter.add_sliding_window_pattern accepts Sequence[bool], true = SWA),
#     .rope.freq_base_swa, .attention.scale -- keys llama.cpp's gemma3 loader ignores.
#     In the latest llama.cpp build graph (src/models/gemma3.cpp) the final softcap is applied
#     only in the non-SWA variant (no sliding_window key).
#   * SWA mask: llama.cpp LLAMA_SWA_TYPE_STANDARD masks p1 - p0 >= n_swa, i.e. the same
#     "query + n_swa-1 previous" window as HF.
#   * tensors: token_embd (rows cut to the tokenizer's real size), output_norm, no output
#     (tied), blk.N.attn_norm (input_layernorm), attn_q, attn_k, attn_v, attn_output,
#     attn_q_norm, attn_k_norm, post_attention_norm (post_attention_layernorm, ATTN_POST_NORM),
#     ffn_norm (pre_feedforward_layernorm, FFN_PRE_NORM), ffn_gate, ffn_up, ffn_down,
#     post_ffw_norm (post_feedforward_layernorm, FFN_POST_NORM). No q/k permutation (NEOX rope).
#   * every tensor whose name ends in "norm.weight" is stored as w + 1 (Gemma3Model.norm_shift),
#     so GGUF norms are plain x * w; the embedding scale sqrt(n_embd) is applied in the graph.
#   * tokenizer: without tokenizer.model the converter uses _set_vocab_gpt2, which needs the
#     pre-tokenizer hash to be known -- it would reject this tiny tokenizer; gen_fixtures.py
#     writes "qwen2" by hand for the same tokenizer.
# --------------------------------------------------------------------------------------

if __name__ == "__main__":
    main()
