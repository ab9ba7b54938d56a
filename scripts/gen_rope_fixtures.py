#!/usr/bin/env python3
"""Generate the RoPE-scaling references under __test__/fixtures/rope/.

Run:   /work/cache/venv/bin/python scripts/gen_rope_fixtures.py
       (after scripts/gen_fixtures.py; any venv with scripts/requirements-fixtures.txt works)

Each case takes one of the tiny fixture models (same weights), gives it a short original
context (64 positions) and a RoPE scaling of one type, and records with HF transformers, in f32:

  * teacher forcing: one forward pass over a 192-token text (three times the original
    context); per position, the logprob of the next token and the top-1 id;
  * for `dynamic` (whose frequencies change as a sequence grows, and which HF applies to each
    forward pass from the sequence's current length): greedy decoding with the KV cache from a
    40-token prompt (decoding crosses the original length) and from 96- and 80-token prompts
    that begin with the same 40 tokens.

The config patch of each case is stored with it, written the way the base model's config is
(transformers 4.x `rope_scaling` + `rope_theta`, or 5.x `rope_parameters`), so the tests read
the scaling from config.json as a user's model would carry it. Llama 3 cases also record the
per-frequency divisors llama.cpp's converter writes as a GGUF `rope_freqs` tensor.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_fixtures import CORPUS, dump_json, f32  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "__test__" / "fixtures"
OUT = FIXTURES / "rope"

ORIGINAL = 64
SEQ_LEN = 192
N_NEW = 40

CASES = {
    "qwen3-yarn": ("qwen3-tiny", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}, 256),
    "qwen3-linear": ("qwen3-tiny", {"rope_type": "linear", "factor": 4.0}, ORIGINAL),
    "qwen3-dynamic": ("qwen3-tiny", {"rope_type": "dynamic", "factor": 4.0}, ORIGINAL),
    "qwen3-llama3": ("qwen3-tiny", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL}, 512),
    "qwen2-yarn-mscale": ("qwen2-tiny", {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIGINAL,
                                         "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 0.8, "mscale_all_dim": 0.5,
                                         "truncate": False}, 512),
    "qwen2-linear": ("qwen2-tiny", {"rope_type": "linear", "factor": 3.0}, ORIGINAL),
    "qwen2-dynamic": ("qwen2-tiny", {"rope_type": "dynamic", "factor": 2.0}, ORIGINAL),
    "qwen2-llama3": ("qwen2-tiny", {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 8.0, "original_max_position_embeddings": ORIGINAL}, 256),
    "llama-yarn": ("llama-tiny", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
                                  "attention_factor": 1.25}, 256),
    "llama-linear": ("llama-tiny", {"rope_type": "linear", "factor": 4.0}, ORIGINAL),
    "llama-dynamic": ("llama-tiny", {"rope_type": "dynamic", "factor": 4.0}, ORIGINAL),
    "llama-llama3": ("llama-tiny", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL}, 512),
}


def config_patch(base_cfg: dict, params: dict, max_pos: int) -> dict:
    """The keys to set in the base model's config.json, in the form it is written in."""
    if "rope_parameters" in base_cfg:
        return {"max_position_embeddings": max_pos,
                "rope_parameters": {"rope_theta": base_cfg["rope_parameters"]["rope_theta"], **params}}
    legacy = {("type" if k == "rope_type" else k): v for k, v in params.items()}
    return {"max_position_embeddings": max_pos, "rope_scaling": legacy}


def load(base: str, patch: dict):
    cfg = AutoConfig.from_pretrained(FIXTURES / base)
    cfg.max_position_embeddings = patch["max_position_embeddings"]
    params = dict(patch.get("rope_parameters") or patch["rope_scaling"])
    params.setdefault("rope_type", params.pop("type", None))
    params.setdefault("rope_theta", cfg.rope_parameters["rope_theta"])
    cfg.rope_parameters = params
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_pretrained(FIXTURES / base, config=cfg, torch_dtype=torch.float32).eval()
    assert model.model.rotary_emb.rope_type == params["rope_type"], model.model.rotary_emb.rope_type
    return model


@torch.no_grad()
def teacher_forced(model, ids):
    logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return {
        "logprobs": [f32(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)],
        "argmax": [int(x) for x in lp.argmax(-1).tolist()[: len(ids) - 1]],
    }


@torch.no_grad()
def greedy(model, prompt, n_new=N_NEW):
    """One forward per token through HF's cache, as `generate` runs it."""
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    past, logits = out.past_key_values, out.logits[0, -1]
    tokens, logprobs = [], []
    for _ in range(n_new):
        lp = torch.log_softmax(logits.float(), -1)
        tok = int(lp.argmax())
        tokens.append(tok)
        logprobs.append(f32(lp[tok]))
        out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1]
    return {"prompt_ids": prompt, "tokens": tokens, "logprobs": logprobs}


def llama3_divisors(base: str, model) -> list[float]:
    """llama.cpp's `rope_freqs`: the default frequencies over the Llama 3 ones."""
    cfg = model.config
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    theta = cfg.rope_parameters["rope_theta"]
    default_inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    llama_inv, _ = ROPE_INIT_FUNCTIONS["llama3"](model.config, "cpu")
    return [f32(x) for x in (default_inv / llama_inv).tolist()]


def main():
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(FIXTURES / "qwen3-tiny" / "tokenizer.json"))
    text_ids = tok.encode(CORPUS).ids
    assert len(text_ids) >= SEQ_LEN + 96, len(text_ids)
    ids = text_ids[:SEQ_LEN]
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (base, params, max_pos) in CASES.items():
        base_cfg = json.loads((FIXTURES / base / "config.json").read_text())
        patch = config_patch(base_cfg, params, max_pos)
        model = load(base, patch)
        case = {
            "base": base,
            "config": patch,
            "transformers": __import__("transformers").__version__,
            "teacher_forced": {"ids": ids, **teacher_forced(model, ids)},
        }
        if params["rope_type"] == "dynamic":
            # A fresh model each: HF's dynamic RoPE keeps state between calls.
            # The prompts share their first 40 tokens, so an engine that shared cache blocks
            # between them wrongly would show it.
            case["greedy"] = [greedy(load(base, patch), text_ids[:n]) for n in (40, 96, 80)]
        if params["rope_type"] == "llama3":
            case["gguf_rope_freqs"] = llama3_divisors(base, model)
        dump_json(OUT / f"{name}.json", case, compact_lists=True)
        tf = case["teacher_forced"]
        print(f"{name}: mean logprob {sum(tf['logprobs']) / len(tf['logprobs']):.3f}, "
              f"{len(set(tf['argmax']))} distinct argmax")


if __name__ == "__main__":
    main()
