#!/usr/bin/env python3
"""Generate __test__/fixtures/quantize-reference.json: HF references for quantize-on-load.

Run:   ~/.cache/expert-runtime/bench-venv/bin/python scripts/gen_quantize_refs.py
       (after scripts/gen_fixtures.py; any venv with torch, transformers and gguf works)

For each tiny fixture model and each `quantize` mode the fixtures can exercise, every 2-D
weight of the model (the projections, the token embedding and an untied lm_head) is replaced by
its round trip through the block format expert-runtime's quantize-on-load picks for it
(src/model/quantize.rs), quantized with gguf-py (llama.cpp's reference quantizers):

  * `q8_0`: Q8_0 everywhere;
  * `q4_0`: Q4_0 for the projections; the embedding and lm_head take Q6_K where their rows
    hold whole 256-value blocks, else Q8_0 (always Q8_0 on these 64-wide models).

(`q4_k` falls back to `q4_0` on rows of 64 or 96 values, so it has no separate reference.)
HF then runs in f32, teacher-forced on the f32 reference's tokens (reference.json), and each
step records the forced token and the top-5 logprobs, as reference.json does.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "__test__" / "fixtures"
MODELS = ["qwen3-tiny", "qwen3-untied-mqa", "qwen2-tiny", "llama-tiny"]


def f32(x) -> float:
    return float(str(np.float32(x)))


def top5(lp: torch.Tensor):
    t = torch.topk(lp, 5)
    return [[int(i), f32(v)] for v, i in zip(t.values.tolist(), t.indices.tolist())]


def fmt(mode: str, name: str, k: int) -> Q:
    embedding = name in ("model.embed_tokens.weight", "lm_head.weight")
    if mode == "q8_0":
        return Q.Q8_0
    if embedding:
        return Q.Q6_K if k % 256 == 0 else Q.Q8_0
    return Q.Q4_0


def round_trip(w: torch.Tensor, q: Q) -> torch.Tensor:
    arr = np.ascontiguousarray(w.detach().numpy(), dtype=np.float32)
    dq = gguf.quants.dequantize(gguf.quants.quantize(arr, q), q).reshape(arr.shape)
    return torch.from_numpy(np.ascontiguousarray(dq))


@torch.no_grad()
def teacher_forced(model, prompt, tokens):
    ids = torch.tensor([prompt + tokens[:-1]], dtype=torch.long)
    lps = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    return [{"token": t, "top5": top5(lps[len(prompt) - 1 + i])} for i, t in enumerate(tokens)]


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    out = {}
    for name in MODELS:
        ref = json.loads((FIXTURES / name / "reference.json").read_text())
        prompt = ref["prompt_ids"]
        tokens = [s["token"] for s in ref["f32"]["steps"]]
        out[name] = {}
        for mode in ["q8_0", "q4_0"]:
            model = AutoModelForCausalLM.from_pretrained(FIXTURES / name, torch_dtype=torch.float32).eval()
            seen = set()
            for pname, p in model.named_parameters():
                if p.ndim != 2 or p.data_ptr() in seen:
                    continue  # norms; a tied lm_head is the embedding
                seen.add(p.data_ptr())
                p.data.copy_(round_trip(p.data, fmt(mode, pname, p.shape[1])))
            out[name][mode] = {"steps": teacher_forced(model, prompt, tokens)}
    path = FIXTURES / "quantize-reference.json"
    path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
