#!/usr/bin/env python3
"""Generate __test__/fixtures/qwen35-tiny/, lfm2-tiny/ and qwen35-llamacpp-tiny/: tiny random
hybrid models (recurrent token mixers beside full attention) with HF greedy references (long
prompts across chunks, a second turn on the cache, ablations), GGUFs as llama.cpp's converter
writes them, and for qwen35-tiny a PEFT LoRA.

Run:   python scripts/gen_hybrid_fixtures.py [NAME ...]   (default all; needs `npm install` for
       node-llama-cpp)
       (any venv with scripts/requirements-fixtures.txt; written with torch 2.15.0,
       transformers 5.24.0, tokenizers 0.23.3, gguf 0.19.0, peft 0.21.2 -- bench-venv)

Seeded, single-threaded CPU, deterministic (PEFT's set order: gen_adapters re-executes this
script with PYTHONHASHSEED=0). Shared tokenizer and Qwen3 chat template, no BOS, the 24-token
prompt of gen_mistral_fixtures.py; f32, eager attention:

  * qwen35-tiny: `Qwen3_5ForCausalLM` (model_type "qwen3_5_text"), 4 layers [linear, linear,
    linear, full] (full_attention_interval 4), hidden 64, MLP 96, untied. Full attention: 4 heads
    / 2 kv, head_dim 16, q_proj giving queries and a sigmoid output gate per head, q/k norms,
    partial RoPE (factor 0.25: 4 of 16 dims), theta 1e4. Linear attention (Gated DeltaNet): 2 key
    heads of 16, 4 value heads of 8 (value head h reads key head h // 2), causal conv kernel 4
    with SiLU over [q, k, v], gated RMSNorm. Qwen3.5's RMSNorms apply (1 + w): w = 0.3*randn;
    the gated norm applies w: 1 + 0.3*randn; A_log = log(U(0.5, 8)), dt_bias = 0.5*randn.
  * lfm2-tiny: `Lfm2ForCausalLM` (model_type "lfm2"), 4 layers [conv, conv, full, conv], hidden
    64, 4 heads / 2 kv (head_dim 16) with q/k norms, short conv L_cache 3 without bias,
    intermediate_size 144 auto-adjusted (x 2/3, x 1.5, up to a multiple of 32) to an MLP of 160,
    theta 1e4, tied; every RMSNorm weight (q/k norms and the final embedding_norm too) 1 + 0.3*randn.
  * qwen35-llamacpp-tiny: qwen35-tiny's shape with value heads of 16 (= key heads, which llama.cpp's
    qwen35 loader requires) and rope_parameters mrope_section [1, 1, 0] (mrope_interleaved), which
    the converter writes as rope.dimension_sections [1, 1, 0, 0]: the 2 rotated pairs of 4 rotary
    dims (llama.cpp asserts the sections' sum <= the rotary dims; the default [11, 11, 10, 0] fails).
    HF ignores the sections on text (equal t/h/w positions). llama.cpp loads it and gives HF's tokens.
  * reference.json (schema of qwen3moe-tiny's): f32 / bf16 / f16 greedy runs on the prompt;
    "long": the first 150 ids of gen_fixtures.CORPUS (past HF's 64-token chunk of the gated delta
    rule), its prefill log-softmax and 16 greedy steps; "second_turn": a second user turn B fed
    as one chunk on HF's cache after prompt + the 16 f32 tokens (each fed), then 16 greedy steps,
    checked against a no-cache recomputation; "ablations": HF's tokens with the recurrent parts
    broken (qwen35: conv an identity, recurrent state zeroed before each decode step, value heads
    in GGUF's tiled order; lfm2: conv an identity, taps reversed, conv state zeroed before each
    decode step); "llamacpp": node-llama-cpp's greedy decode of model-f32.gguf (also on "long"), or
    the loader's refusal (qwen35-tiny). Seeds: sequence_ok on the prompt, long and second turn,
    every ablation other tokens.
  * model-f32.gguf: see scripts/hybrid_gguf.py (tensor transforms, metadata); checked tensor by
    tensor against the HF weights and by a numpy float64 forward with llama.cpp's semantics.
  * qwen35-tiny/experts/lora: LoRA r=4 on the linear-attention projections (in_proj_qkv,
    in_proj_z, out_proj), the full-attention and MLP projections, with experts/reference.json.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, Lfm2Config, Lfm2ForCausalLM, Qwen3_5ForCausalLM, Qwen3_5TextConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_adapters import describe_keys, reference, write_family_experts  # noqa: E402
from gen_fixtures import (ADDED_TOKENS, CORPUS, SPECIAL_TOKENS, _lp_record, build_tokenizer,  # noqa: E402
                          check_recompute, dump_json, f32, greedy_reference, sequence_ok)
from gen_gemma3_gguf_fixture import llamacpp_greedy  # noqa: E402
from gen_mistral_fixtures import PROMPT_LEN, PROMPT_TEXT, reference_runs, save_model_dir  # noqa: E402
import hybrid_gguf as hg  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "__test__" / "fixtures"
N_NEW = 16
MAX_SEED_TRIES = 300
LONG_LEN = 150
SECOND_TURN = "<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n"
LORA_TARGETS = ["in_proj_qkv", "in_proj_z", "out_proj", "q_proj", "k_proj", "v_proj", "o_proj",
                "gate_proj", "up_proj", "down_proj"]

ROPE = {"rope_type": "default", "rope_theta": 10000.0}
QWEN35_CFG = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  layer_types=["linear_attention"] * 3 + ["full_attention"], num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
                  initializer_range=0.2, tie_word_embeddings=False, max_position_embeddings=256, hidden_act="silu",
                  attention_bias=False, attention_dropout=0.0, use_cache=True,
                  rope_parameters={**ROPE, "partial_rotary_factor": 0.25})
# llamacpp_loads: whether node-llama-cpp's llama.cpp must load model-f32.gguf (and then give HF's tokens)
# or must refuse it; experts: write experts/lora
SPECS = {
    "qwen35-tiny": dict(arch="qwen35", seed=20000, classes=(Qwen3_5TextConfig, Qwen3_5ForCausalLM), cfg=QWEN35_CFG,
                        llamacpp_loads=False, experts=True),
    "lfm2-tiny": dict(
        arch="lfm2", seed=21000, classes=(Lfm2Config, Lfm2ForCausalLM), llamacpp_loads=True, experts=False,
        cfg=dict(hidden_size=64, num_hidden_layers=4, layer_types=["conv", "conv", "full_attention", "conv"],
                 num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3, conv_bias=False,
                 intermediate_size=144, block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.5,
                 block_multiple_of=32, norm_eps=1e-5, initializer_range=0.2, tie_word_embeddings=True,
                 max_position_embeddings=256, use_cache=True, rope_parameters=dict(ROPE))),
    # qwen35-tiny's shape in what llama.cpp's qwen35 loader takes: value heads as wide as key heads, and
    # M-RoPE sections (HF ignores them on text) covering the 2 rotated pairs, as Qwen3.5's [11, 11, 10]
    # covers its 32
    "qwen35-llamacpp-tiny": dict(
        arch="qwen35", seed=22000, classes=(Qwen3_5TextConfig, Qwen3_5ForCausalLM), llamacpp_loads=True,
        experts=False, cfg={**QWEN35_CFG, "linear_value_head_dim": 16,
                            "rope_parameters": {**QWEN35_CFG["rope_parameters"], "mrope_section": [1, 1, 0],
                                                "mrope_interleaved": True}}),
}


def build_model(spec, seed: int, vocab_size: int, ids: dict):
    Config, Model = spec["classes"]
    config = Config(**copy.deepcopy(spec["cfg"]), vocab_size=vocab_size, pad_token_id=ids["<|endoftext|>"],
                    bos_token_id=None, eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]])
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Model(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    rnd = lambda shape: torch.randn(shape, generator=gen)  # noqa: E731
    counts = {}
    with torch.no_grad():
        for mod in model.modules():
            kind = type(mod).__name__
            if kind == "Qwen3_5RMSNorm":  # x * (1 + w)
                mod.weight.copy_(0.3 * rnd(mod.weight.shape))
            elif kind in ("Qwen3_5RMSNormGated", "Lfm2RMSNorm"):  # x * w
                mod.weight.copy_(1.0 + 0.3 * rnd(mod.weight.shape))
            elif kind == "Qwen3_5GatedDeltaNet":
                mod.A_log.copy_(torch.log(0.5 + 7.5 * torch.rand(mod.A_log.shape, generator=gen)))
                mod.dt_bias.copy_(0.5 * rnd(mod.dt_bias.shape))
            else:
                continue
            counts[kind] = counts.get(kind, 0) + 1
    want = ({"Qwen3_5RMSNorm": 2 * 4 + 2 + 1, "Qwen3_5RMSNormGated": 3, "Qwen3_5GatedDeltaNet": 3}
            if spec["arch"] == "qwen35" else {"Lfm2RMSNorm": 2 * 4 + 2 + 1})
    assert counts == want, counts
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


# --------------------------------------------------------------------------------------
# greedy runs on HF's cache
# --------------------------------------------------------------------------------------

@torch.no_grad()
def continue_greedy(model, ids, n, cache=None, hook=None):
    """Feed `ids` as one forward on `cache`, then n greedy steps, each chosen token fed back
    (the n-th too, so the cache holds it). `hook(cache)` runs before every decode forward."""
    out = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    cache, logits = out.past_key_values, out.logits[0, -1]
    res = {"prefill_top5": _lp_record(torch.log_softmax(logits.float(), -1)), "steps": []}
    margins = []
    for _ in range(n):
        lp = torch.log_softmax(logits.float(), -1)
        tok = int(torch.argmax(lp))
        srt = torch.sort(lp, descending=True).values
        margins.append(float(srt[0] - srt[1]))
        res["steps"].append({"token": tok, "logprob": f32(lp[tok]), "top5": _lp_record(lp)})
        if hook is not None:
            hook(cache)
        out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
        cache, logits = out.past_key_values, out.logits[0, -1]
    return res, margins, cache


def toks(steps):
    return [s["token"] for s in steps]


@torch.no_grad()
def second_turn(model, prompt_ids, f32_steps, turn_ids):
    """HF's cache after prompt + the 16 greedy tokens (all fed), then the turn as one chunk, then
    16 greedy steps."""
    first, _, cache = continue_greedy(model, prompt_ids, N_NEW)
    assert toks(first["steps"]) == toks(f32_steps)
    return continue_greedy(model, turn_ids, N_NEW, cache=cache)[:2]


@torch.no_grad()
def check_second_turn(model, prompt_ids, f32_steps, turn_ids, steps):
    """The cached second turn equals a fresh no-cache forward of the whole conversation."""
    seq = list(prompt_ids) + toks(f32_steps) + list(turn_ids) + toks(steps)[:-1]
    lps = torch.log_softmax(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0].float(), -1)
    base = len(prompt_ids) + N_NEW + len(turn_ids) - 1
    worst = 0.0
    for i, s in enumerate(steps):
        assert int(torch.argmax(lps[base + i])) == s["token"], i
        worst = max(worst, abs(float(lps[base + i, s["token"]]) - s["logprob"]))
    assert worst < 1e-4, worst
    return worst


def zero_states(kind: str):
    """A hook zeroing every linear-attention cache layer's `conv_states` / `recurrent_states`."""
    def hook(cache):
        n = 0
        for layer in cache.layers:
            for st in getattr(layer, kind, {}).values():
                if st is not None:
                    st.zero_()
                    n += 1
        assert n > 0, kind
    return hook


# --------------------------------------------------------------------------------------
# ablations: the same weights with a recurrent part broken
# --------------------------------------------------------------------------------------

@torch.no_grad()
def conv_identity(m):
    for mod in m.modules():
        if isinstance(mod, torch.nn.Conv1d):
            mod.weight.zero_()
            mod.weight[:, 0, -1] = 1.0  # the tap on the current token


@torch.no_grad()
def conv_reversed(m):
    for mod in m.modules():
        if isinstance(mod, torch.nn.Conv1d):
            mod.weight.copy_(mod.weight.flip(-1))


@torch.no_grad()
def v_heads_tiled(m):
    """HF's weights with the value heads permuted as the GGUF stores them (tiled), read by HF's
    grouped mapping: what a GGUF loader gets if it keeps HF's value-head -> key-head sharing."""
    c = m.config
    nk, r, dv = c.linear_num_key_heads, c.linear_num_value_heads // c.linear_num_key_heads, c.linear_value_head_dim
    kd = nk * c.linear_key_head_dim
    for layer in m.model.layers:
        la = getattr(layer, "linear_attn", None)
        if la is None:
            continue
        la.in_proj_qkv.weight[2 * kd:] = hg.v_tiled(la.in_proj_qkv.weight[2 * kd:].clone(), 0, nk, r, dv)
        la.conv1d.weight[2 * kd:] = hg.v_tiled(la.conv1d.weight[2 * kd:].clone(), 0, nk, r, dv)
        la.in_proj_z.weight.copy_(hg.v_tiled(la.in_proj_z.weight.clone(), 0, nk, r, dv))
        la.out_proj.weight.copy_(hg.v_tiled(la.out_proj.weight.clone(), 1, nk, r, dv))
        for p in (la.in_proj_a.weight, la.in_proj_b.weight):
            p.copy_(hg.v_tiled(p.clone(), 0, nk, r, 1))
        for p in (la.A_log, la.dt_bias):
            p.copy_(hg.v_tiled(p.clone()[:, None], 0, nk, r, 1)[:, 0])


ABLATIONS = {
    "qwen35": {"conv_identity": (conv_identity, None), "state_reset": (None, "recurrent_states"),
               "v_heads_tiled": (v_heads_tiled, None)},
    "lfm2": {"conv_identity": (conv_identity, None), "conv_taps_reversed": (conv_reversed, None),
             "conv_state_reset": (None, "conv_states")},
}


def ablations(model, arch, prompt_ids):
    out = {}
    for name, (edit, states) in ABLATIONS[arch].items():
        m = copy.deepcopy(model).eval()
        if edit is not None:
            edit(m)
        r, _, _ = continue_greedy(m, prompt_ids, N_NEW, hook=zero_states(states) if states else None)
        out[name] = {"tokens": toks(r["steps"]), "logprobs": [s["logprob"] for s in r["steps"]]}
    return out


# --------------------------------------------------------------------------------------
# llama.cpp
# --------------------------------------------------------------------------------------

LOAD_PROBE = r"""
import { createRequire } from 'node:module'
const require = createRequire(process.cwd() + '/package.json')
const { getLlama } = await import(require.resolve('node-llama-cpp'))
const logs = []
const logger = (level, text) => logs.push(text.trim())
const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'warn', logger })
let err = null
try { await (await llama.loadModel({ modelPath: process.argv[2] })).dispose() } catch (e) { err = String(e) }
const why = () => logs.filter(l => l.includes('error loading model')).join('; ')
for (let i = 0; err !== null && !why() && i < 100; i++) await new Promise(r => setTimeout(r, 20))  // logs come async
console.log(JSON.stringify(err === null ? null : why() || err))
"""


def llamacpp(path: Path, ids, n):
    """node-llama-cpp's greedy decode, or {"unsupported": why its llama.cpp refuses the file}."""
    try:
        return llamacpp_greedy(path, ids, n)
    except subprocess.CalledProcessError:
        with tempfile.TemporaryDirectory() as tmp:  # a file: node-llama-cpp's binary test re-runs node
            (Path(tmp) / "probe.mjs").write_text(LOAD_PROBE)
            out = subprocess.run(["node", str(Path(tmp) / "probe.mjs"), str(path)], check=True,
                                 capture_output=True, text=True, cwd=ROOT)
        why = json.loads(out.stdout.strip().splitlines()[-1])
        assert why, "llama.cpp loads the file but the decode failed"
        return {"unsupported": re.sub(r"\s+", " ", why)}


# --------------------------------------------------------------------------------------

def load_dir(d: Path):
    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()


def pick_seed(name, spec, vocab_size, ids, prompt_ids, long_ids, turn_ids):
    bad = list(ids.values())
    for seed in range(spec["seed"], spec["seed"] + MAX_SEED_TRIES):
        model = build_model(spec, seed, vocab_size, ids)
        f32_ref, m32 = greedy_reference(model, prompt_ids, full_prefill=True)
        t = toks(f32_ref["steps"])
        if not (sequence_ok(f32_ref["steps"], m32, bad) and max(t.count(x) for x in t) <= 4):
            continue
        long_ref, ml = greedy_reference(model, long_ids, full_prefill=True)
        if not sequence_ok(long_ref["steps"], ml, bad):
            continue
        st, ms = second_turn(model, prompt_ids, f32_ref["steps"], turn_ids)
        if not sequence_ok(st["steps"], ms, bad):
            continue
        abl = ablations(model, spec["arch"], prompt_ids)
        if all(a["tokens"] != t for a in abl.values()):
            print(f"{name}: seed={seed} (attempt {seed - spec['seed']}) tokens={t}; min margins: prompt "
                  f"{min(m32):.4f}, long {min(ml):.4f}, second turn {min(ms):.4f}")
            return seed, model, f32_ref, long_ref, st, abl
    raise SystemExit(f"{name}: no acceptable seed found")


def check_reload(out: Path, model, prompt_ids, f32_ref):
    m = load_dir(out)
    assert type(m) is type(model), type(m)
    sd, sd2 = model.state_dict(), m.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    r, _ = greedy_reference(m, prompt_ids)
    assert toks(r["steps"]) == toks(f32_ref["steps"])
    assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(r["steps"], f32_ref["steps"])) < 1e-5


def write_experts(out: Path, name: str, model, prompt_ids):
    """experts/lora (LoRA r=4, alpha 8, random non-zero A and B) and experts/reference.json."""
    write_family_experts(out, name, prompt_ids, targets=LORA_TARGETS, kinds=["lora"])
    c = model.config
    want = []
    for i, lt in enumerate(c.layer_types):
        mods = ([f"linear_attn.{p}" for p in ("in_proj_qkv", "in_proj_z", "out_proj")] if lt == "linear_attention"
                else [f"self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")])
        want += [f"model.layers.{i}.{p}" for p in mods + [f"mlp.{q}" for q in ("gate_proj", "up_proj", "down_proj")]]
    keys = describe_keys(out / "experts" / "lora")
    got = sorted({k.removeprefix("base_model.model.").split(".lora_")[0] for k in keys})
    assert got == sorted(want), got
    cases = json.loads((out / "experts" / "reference.json").read_text())["cases"]
    pm = PeftModel.from_pretrained(load_dir(out), out / "experts" / "lora").eval()
    steps, _ = reference(pm, prompt_ids)
    assert toks(steps) == toks(cases["lora"]["steps"])
    assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(steps, cases["lora"]["steps"])) < 1e-5
    print(f"  experts/lora adapts {len(got)} modules ({len(keys)} tensors), e.g. "
          + ", ".join(f"{k} {keys[k]}" for k in sorted(keys) if ".layers.0.linear_attn.in_proj_qkv" in k)
          + "; reloaded by PEFT: same steps")


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    np.random.seed(0)

    tok = build_tokenizer()
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS + ADDED_TOKENS}
    prompt_ids = tok.encode(PROMPT_TEXT).ids
    assert len(prompt_ids) == PROMPT_LEN, len(prompt_ids)
    long_ids = tok.encode(CORPUS).ids[:LONG_LEN]
    turn_ids = tok.encode(SECOND_TURN).ids
    assert turn_ids[0] == ids["<|im_end|>"] and turn_ids.count(ids["<|im_start|>"]) == 2, turn_ids
    tokenizer_config = json.loads((OUT / "llama-tiny" / "tokenizer_config.json").read_text())

    names = sys.argv[1:] or list(SPECS)
    if not set(names) <= set(SPECS):
        raise SystemExit(f"usage: gen_hybrid_fixtures.py [{' | '.join(SPECS)} ...]")
    for name in names:
        spec, arch = SPECS[name], SPECS[name]["arch"]
        seed, model, f32_ref, long_ref, st, abl = pick_seed(name, spec, vocab_size, ids, prompt_ids, long_ids,
                                                            turn_ids)
        t = toks(f32_ref["steps"])
        for k, a in abl.items():
            d = [i for i, (x, y) in enumerate(zip(a["tokens"], t)) if x != y]
            print(f"  ablation {k}: {len(d)}/{N_NEW} tokens differ (first at {d[0]})")
        ref = reference_runs(model, tok, name, seed, prompt_ids, f32_ref)
        worst_long = check_recompute(model, long_ids, long_ref["steps"])
        assert worst_long < 1e-4, worst_long
        worst_turn = check_second_turn(model, prompt_ids, f32_ref["steps"], turn_ids, st["steps"])
        print(f"  long ({LONG_LEN} ids) and second turn ({len(turn_ids)} ids): cached decode = no-cache forward "
              f"(max |dlogprob| {worst_long:.1e}, {worst_turn:.1e})")
        ref["long"] = {"prompt_ids": long_ids, "f32": long_ref}
        ref["second_turn"] = {"prompt_text": SECOND_TURN, "prompt_ids": turn_ids, "f32": st}
        ref["ablations"] = {"prompt": "prompt_ids", "n_new": N_NEW, "f32": abl}

        out = OUT / name
        save_model_dir(out, model, tok, tokenizer_config, ids, ref)
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["model_type"] == ("qwen3_5_text" if arch == "qwen35" else "lfm2"), cfg
        assert cfg["architectures"] == [type(model).__name__] and cfg["layer_types"] == spec["cfg"]["layer_types"]
        assert cfg["rope_parameters"] == spec["cfg"]["rope_parameters"], cfg["rope_parameters"]
        check_reload(out, model, prompt_ids, f32_ref)
        if arch == "lfm2":
            w = [l.feed_forward.w1.weight.shape[0] for l in model.model.layers]
            assert w == [hg.lfm2_ffn_width(model.config)] * 4 == [160] * 4, w
        print(f"  reload OK (weights equal, same tokens); config.json model_type {cfg['model_type']}")

        gguf_path = out / "model-f32.gguf"
        arrays = hg.write_gguf(gguf_path, arch, name, model, json.loads(tok.to_str()), ids,
                               tokenizer_config["chat_template"])
        kv, rt = hg.check_gguf(gguf_path, arrays, model, arch)
        print(f"  model-f32.gguf: {len(arrays)} tensors, every one back to its HF tensor within {rt:.1e}; "
              + ", ".join(f"{k}={v}" for k, v in kv.items()))
        for what, ids_, r in (("prompt", prompt_ids, f32_ref), ("long", long_ids, long_ref)):
            err = float(np.abs(hg.numpy_prefill(gguf_path, ids_) - np.array(r["prefill_logprobs"])).max())
            # long: HF's chunked delta rule runs in f32 (even in a float64 model), ~3e-4 off on
            # qwen35-llamacpp-tiny's, whose float64 forward is within 4e-5 of HF's per-token form
            assert err < (1e-4 if what == "prompt" else 4e-4), (what, err)
            print(f"  numpy float64 forward of the GGUF (llama.cpp semantics), {what}: prefill max |dlogprob| "
                  f"vs HF {err:.1e}")
        ll = llamacpp(gguf_path, prompt_ids, N_NEW)
        assert ("unsupported" not in ll) == spec["llamacpp_loads"], ll
        if "unsupported" in ll:
            print(f"  llama.cpp refuses model-f32.gguf: {ll['unsupported']}")
        else:
            assert ll["tokens"] == t, f"llama.cpp decodes the GGUF otherwise: {ll['tokens']} vs HF {t}"
            worst = max(abs(a - s["logprob"]) for a, s in zip(ll["logprobs"], f32_ref["steps"]))
            ll_long = llamacpp(gguf_path, long_ids, N_NEW)
            assert ll_long["tokens"] == toks(long_ref["steps"]), (ll_long["tokens"], toks(long_ref["steps"]))
            worst_l = max(abs(a - s["logprob"]) for a, s in zip(ll_long["logprobs"], long_ref["steps"]))
            ref["long"]["llamacpp"] = ll_long
            print(f"  llama.cpp on model-f32.gguf: HF's tokens on the prompt and the long prompt, max |dlogprob| "
                  f"{worst:.1e} / {worst_l:.1e}")
        ref["llamacpp"] = ll
        dump_json(out / "reference.json", ref, compact_lists=True)

        if spec["experts"]:
            write_experts(out, name, model, prompt_ids)
        sizes = {p.relative_to(out).as_posix(): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
        print(f"  {out.relative_to(ROOT)} {sum(sizes.values()) / 1e3:.0f} KB: "
              + ", ".join(f"{k} {v / 1e3:.0f}" for k, v in sizes.items()))


if __name__ == "__main__":
    main()
