#!/usr/bin/env python3
"""Generate __test__/fixtures/mistral-tiny/ and ministral-tiny/: tiny random Mistral and
Ministral models with sliding windows, and their greedy references.

Run:   python scripts/gen_mistral_fixtures.py
       (any venv with scripts/requirements-fixtures.txt; written with torch 2.15.0,
       transformers 5.24.0, tokenizers 0.23.3 -- ~/.cache/expert-runtime/bench-venv)

Seeded, single-threaded CPU, deterministic. Same layout and reference.json schema as
llama-tiny (see __test__/fixtures/README.md), with the shared tiny BPE tokenizer and the
Qwen3 chat template of gen_fixtures.py (no BOS):

  * mistral-tiny: `MistralForCausalLM` (model_type "mistral"), 2 layers, every one sliding with
    sliding_window 6; 4 heads / 1 kv head (head_dim 16), untied embeddings.
  * ministral-tiny: `MinistralForCausalLM` (model_type "ministral"), 3 layers with layer_types
    [sliding, full, sliding], sliding_window 5; 4 heads / 2 kv heads, explicit head_dim 24
    (!= hidden / heads), tied embeddings.
  * Both: eager attention, f32, RMSNorm weights 1 + 0.3*randn. The 24-token prompt and its 16
    new tokens run far past the window. "ablations" records HF's greedy run with the window
    ignored and off by one either way: the seed is chosen so that each changes a token.
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
from transformers import (AutoModelForCausalLM, MinistralConfig, MinistralForCausalLM, MistralConfig,
                          MistralForCausalLM)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_fixtures import (ADDED_TOKENS, SPECIAL_TOKENS, build_tokenizer, check_recompute,  # noqa: E402
                          dump_json, greedy_reference, load_qwen3_chat_template, sequence_ok)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "__test__" / "fixtures"

PROMPT_TEXT = "Once upon a time a little robot read 日本 signs."
PROMPT_LEN = 24
N_NEW = 16
MAX_SEED_TRIES = 300

COMMON = dict(hidden_size=64, intermediate_size=96, rms_norm_eps=1e-5, max_position_embeddings=256,
              initializer_range=0.2, hidden_act="silu", attention_dropout=0.0, use_cache=True,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})

SPECS = {
    "mistral-tiny": dict(
        classes=(MistralConfig, MistralForCausalLM), seed=6000, window=6, types=None,
        cfg=dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                 sliding_window=6, tie_word_embeddings=False),
    ),
    "ministral-tiny": dict(
        classes=(MinistralConfig, MinistralForCausalLM), seed=7000, window=5,
        types=["sliding_attention", "full_attention", "sliding_attention"],
        cfg=dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                 sliding_window=5, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                 tie_word_embeddings=True),
    ),
}


def build_model(spec, seed: int, vocab_size: int, ids: dict):
    Config, Model = spec["classes"]
    config = Config(**copy.deepcopy(COMMON), **copy.deepcopy(spec["cfg"]), vocab_size=vocab_size,
                    pad_token_id=ids["<|endoftext|>"], bos_token_id=None,
                    eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]])
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Model(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for mod in model.modules():
            if type(mod).__name__.endswith("RMSNorm"):
                mod.weight.copy_(1.0 + 0.3 * torch.randn(mod.weight.shape, generator=gen))
    return model


def ablations(model, prompt_ids, window):
    """HF's greedy run with the window ignored, one too wide and one too narrow."""
    out = {}
    for name, w in (("window_ignored", 4096), (f"window_{window + 1}", window + 1), (f"window_{window - 1}", window - 1)):
        m = copy.deepcopy(model).eval()
        m.config.sliding_window = w
        for layer in m.model.layers:  # Ministral copies the window into its sliding layers
            if getattr(layer.self_attn, "sliding_window", None) is not None:
                layer.self_attn.sliding_window = w
        r, _ = greedy_reference(m, prompt_ids, n_new=N_NEW)
        out[name] = {"tokens": [s["token"] for s in r["steps"]], "logprobs": [s["logprob"] for s in r["steps"]]}
    return out


def reference_runs(model, tok, name, seed, prompt_ids, f32):
    """reference.json's f32 (checked against a full recompute), bf16 and f16 runs."""
    worst = check_recompute(model, prompt_ids, f32["steps"])
    assert worst < 1e-4, worst
    f32["generated_text"] = tok.decode([s["token"] for s in f32["steps"]], skip_special_tokens=False)
    ref = {"model": name, "seed": seed, "prompt_text": PROMPT_TEXT, "prompt_ids": prompt_ids, "n_new": N_NEW,
           "f32": f32}
    for key, dt in (("bf16", torch.bfloat16), ("f16", torch.float16)):
        r, mm = greedy_reference(copy.deepcopy(model).to(dt).eval(), prompt_ids)
        r["generated_text"] = tok.decode([s["token"] for s in r["steps"]], skip_special_tokens=False)
        ref[key] = r
        agree = sum(a["token"] == b["token"] for a, b in zip(r["steps"], f32["steps"]))
        print(f"  {key}: agrees with f32 on {agree}/{N_NEW} steps, min margin={min(mm):.4f}")
    return ref


def save_model_dir(d: Path, model, tok, tokenizer_config: dict, ids: dict, ref: dict):
    """The HF directory: weights, the shared tokenizer, generation config and reference.json."""
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    model.save_pretrained(d, safe_serialization=True)
    (d / "tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")
    dump_json(d / "tokenizer_config.json", tokenizer_config)
    dump_json(d / "generation_config.json",
              {"bos_token_id": None, "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
               "pad_token_id": ids["<|endoftext|>"], "transformers_version": transformers.__version__},
              sort_keys=True)
    dump_json(d / "reference.json", ref, compact_lists=True)


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    np.random.seed(0)

    tok = build_tokenizer()
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS + ADDED_TOKENS}
    bad = list(ids.values())
    prompt_ids = tok.encode(PROMPT_TEXT).ids
    assert len(prompt_ids) == PROMPT_LEN and tok.decode(prompt_ids) == PROMPT_TEXT, len(prompt_ids)
    tokenizer_config = json.loads((OUT / "llama-tiny" / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == load_qwen3_chat_template()

    for name, spec in SPECS.items():
        seed = spec["seed"]
        for attempt in range(MAX_SEED_TRIES):
            model = build_model(spec, seed, vocab_size, ids)
            f32, m32 = greedy_reference(model, prompt_ids, full_prefill=True)
            toks = [s["token"] for s in f32["steps"]]
            ok = sequence_ok(f32["steps"], m32, bad) and max(toks.count(t) for t in toks) <= 4
            if ok:
                abl = ablations(model, prompt_ids, spec["window"])
                ok = all(a["tokens"] != toks for a in abl.values())
            if ok:
                break
            seed += 1
        else:
            raise SystemExit(f"{name}: no acceptable seed found")
        # Mistral's attention reads the config's window at each call; Ministral's layers hold theirs.
        windows = [getattr(l.self_attn, "sliding_window", model.config.sliding_window) for l in model.model.layers]
        want = [spec["window"] if t == "sliding_attention" else None
                for t in (spec["types"] or ["sliding_attention"] * len(windows))]
        assert windows == want, (windows, want)
        print(f"{name}: seed={seed} (attempt {attempt}) windows={windows} tokens={toks} min margin={min(m32):.4f}")
        for k, v in abl.items():
            d = [i for i, (a, b) in enumerate(zip(v["tokens"], toks)) if a != b]
            print(f"  ablation {k}: {len(d)}/{N_NEW} tokens differ (first at {d[0]})")

        ref = reference_runs(model, tok, name, seed, prompt_ids, f32)
        ref["ablations"] = {"prompt": "prompt_ids", "n_new": N_NEW, "f32": abl}
        d = OUT / name
        save_model_dir(d, model, tok, tokenizer_config, ids, ref)

        cfg = json.loads((d / "config.json").read_text())
        assert cfg["model_type"] == name.split("-")[0] and cfg["sliding_window"] == spec["window"], cfg
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        r, _ = greedy_reference(m, prompt_ids)
        assert [s["token"] for s in r["steps"]] == toks
        assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(r["steps"], f32["steps"])) < 1e-5
        total = sum(p.stat().st_size for p in d.iterdir())
        print(f"  reload OK; {d.relative_to(ROOT)} {total / 1e3:.0f} KB")


if __name__ == "__main__":
    main()
