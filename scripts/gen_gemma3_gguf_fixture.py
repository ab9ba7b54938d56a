#!/usr/bin/env python3
"""Generate __test__/fixtures/gemma3-gguf-tiny/: a tiny random Gemma 3 text model in the layout
llama.cpp gives every `gemma3` GGUF, written as llama.cpp's converter writes it, with HF's greedy
reference and llama.cpp's own decode of the file.

Run:   python scripts/gen_gemma3_gguf_fixture.py   (needs `npm install` for node-llama-cpp)
       (any venv with scripts/requirements-fixtures.txt; written with torch 2.15.0,
       transformers 5.24.0, gguf 0.19.0 -- ~/.cache/expert-runtime/bench-venv)

A gemma3 GGUF holds the window but not the layer pattern, the local rotary base or the score
scale: llama.cpp's loader fixes them (every sixth layer full, base 10,000, 1/sqrt(head_dim)), so
gemma3-tiny's [S,S,F,S] layout and scalar 24 cannot be written as one. This model has what the
loader assumes: 6 layers (0-4 sliding with window 8, 5 full), query_pre_attn_scalar = head_dim
= 32, rope bases 1e6 / 1e4, no final soft-cap (llama.cpp's graph for the sliding variant has
none). Otherwise as gemma3-tiny: hidden 64, 4 heads / 2 kv, GELU-tanh, tied embeddings, random
Gemma norms (see gen_gemma3_fixtures.py), the same tokenizer and 25-token prompt.

  * model-f32.gguf: general.architecture "gemma3" with llama.cpp's tensor names; every tensor
    whose name ends in norm.weight stored as w + 1 (the converter's norm shift); no output
    tensor (tied); gpt2 BPE tokenizer with the qwen2 pre-tokenizer (as gen_fixtures.py writes
    the shared tokenizer), <bos> 400, <end_of_turn> 402.
  * reference.json: HF's f32 greedy decode of the prompt (16 new tokens, past the window) with
    the prefill's full log-softmax, and "llamacpp": node-llama-cpp's greedy tokens and logprobs
    on model-f32.gguf (scripts/llamacpp_greedy.mjs), which must equal HF's tokens.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from tokenizers import AddedToken

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_fixtures import build_tokenizer, check_recompute, dump_json, greedy_reference, new_gguf_writer, sequence_ok  # noqa: E402
from gen_gemma3_fixtures import (CFG, CHAT_TEMPLATE, GEMMA_SPECIALS, N_NEW, PROMPT_LEN, PROMPT_TEXT,  # noqa: E402
                                 build_model)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "__test__" / "fixtures" / "gemma3-gguf-tiny"
NAME = "gemma3-gguf-tiny"
BASE_SEED = 7000
MAX_SEED_TRIES = 300

GGUF_CFG = {**CFG, "num_hidden_layers": 6, "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
            "query_pre_attn_scalar": 32, "final_logit_softcapping": None}

# (GGUF tensor in blk.N, HF tensor in model.layers.N), in the converter's order.
LAYER_TENSORS = [
    ("attn_norm", "input_layernorm"), ("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"), ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"), ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"), ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"), ("post_ffw_norm", "post_feedforward_layernorm"),
]


def gguf_tensors(model):
    """(gguf name, f32 array) as llama.cpp's Gemma3Model converter stores them."""
    sd = {k: v.detach().to(torch.float32).numpy() for k, v in model.state_dict().items()}
    names = [("token_embd.weight", "model.embed_tokens.weight")]
    for i in range(model.config.num_hidden_layers):
        names += [(f"blk.{i}.{g}.weight", f"model.layers.{i}.{h}.weight") for g, h in LAYER_TENSORS]
    names.append(("output_norm.weight", "model.norm.weight"))
    out = []
    for g, h in names:
        arr = sd[h]
        if g.endswith("norm.weight"):
            arr = arr + 1.0  # Gemma norms are x * (1 + w); GGUF stores the 1 added
        out.append((g, np.ascontiguousarray(arr, dtype=np.float32)))
    return out


def write_gguf(path: Path, model, tok_json: dict, ids: dict):
    c = model.config
    w = new_gguf_writer(path, "gemma3", GGMLQuantizationType.F32, NAME, n_layer=c.num_hidden_layers,
                        n_ctx=c.max_position_embeddings, n_embd=c.hidden_size, n_ff=c.intermediate_size,
                        n_head=c.num_attention_heads, n_kv=c.num_key_value_heads, head_dim=c.head_dim,
                        rope_theta=c.rope_parameters["full_attention"]["rope_theta"], rms_eps=c.rms_norm_eps,
                        vocab_size=c.vocab_size, tok_json=tok_json, eos_id=ids["<end_of_turn>"],
                        pad_id=ids["<|endoftext|>"], bos_id=ids["<bos>"], chat_template=CHAT_TEMPLATE)
    w.add_sliding_window(c.sliding_window)
    for name, arr in gguf_tensors(model):
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llamacpp_greedy(path: Path, prompt_ids, n):
    out = subprocess.run(["node", str(ROOT / "scripts" / "llamacpp_greedy.mjs"), str(path), json.dumps(prompt_ids), str(n)],
                         check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    tok = build_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GEMMA_SPECIALS])
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    ids = {t: tok.token_to_id(t) for t in ["<|endoftext|>", *GEMMA_SPECIALS]}
    prompt_ids = tok.encode(PROMPT_TEXT).ids
    assert len(prompt_ids) == PROMPT_LEN and vocab_size == 403, (len(prompt_ids), vocab_size)
    bad = sorted(set(range(395, 403)))

    for seed in range(BASE_SEED, BASE_SEED + MAX_SEED_TRIES):
        model = build_model(seed, vocab_size, ids, GGUF_CFG)
        ref, margins = greedy_reference(model, prompt_ids, full_prefill=True)
        toks = [s["token"] for s in ref["steps"]]
        if sequence_ok(ref["steps"], margins, bad) and max(toks.count(t) for t in toks) <= 4:
            break
    else:
        raise SystemExit("no acceptable seed found")
    assert [l.self_attn.sliding_window for l in model.model.layers] == [8] * 5 + [None]
    assert all(abs(l.self_attn.scaling - 32 ** -0.5) < 1e-12 for l in model.model.layers)
    worst = check_recompute(model, prompt_ids, ref["steps"])
    assert worst < 1e-4, worst
    print(f"{NAME}: seed {seed}, tokens {toks}, min margin {min(margins):.4f}")

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    gguf_path = OUT / "model-f32.gguf"
    write_gguf(gguf_path, model, json.loads(tok.to_str()), ids)

    ll = llamacpp_greedy(gguf_path, prompt_ids, N_NEW)
    worst_ll = max(abs(a - s["logprob"]) for a, s in zip(ll["logprobs"], ref["steps"]))
    assert ll["tokens"] == toks, f"llama.cpp decodes the GGUF otherwise: {ll['tokens']} vs HF {toks}"
    print(f"  llama.cpp ({ll['engine']}) on model-f32.gguf: the same {N_NEW} tokens, max |dlogprob| vs HF {worst_ll:.2e}")

    dump_json(OUT / "reference.json", {"model": NAME, "seed": seed, "prompt_text": PROMPT_TEXT, "prompt_ids": prompt_ids,
                                       "n_new": N_NEW, "f32": ref, "llamacpp": ll}, compact_lists=True)
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"{OUT.relative_to(ROOT)}: " + ", ".join(f"{p.name} {p.stat().st_size}" for p in sorted(OUT.iterdir()))
          + f"; total {total / 1e3:.0f} KB")


if __name__ == "__main__":
    main()
