"""HF transformers reference for SmolLM2-135M-Instruct Q4_1 GGUF (weights dequantized to f32).

Writes __test__/fixtures/smollm2-reference.json: for the first candidate prompt whose 16 greedy
steps all have a top-1/top-2 margin of at least MIN_MARGIN nats under this reference, the prompt
ids and the 16 greedy tokens with their margins. Quantized engines (ours, llama.cpp) perturb
logits by a few hundredths of a nat; a prompt with a near-tie in its first 16 steps could not
tell an engine bug from quantization noise.

Usage: python scripts/gen_smollm2_reference.py <SmolLM2-135M-Instruct.Q4_1.gguf>
(needs torch, transformers, gguf; see scripts/requirements-fixtures.txt)
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

MIN_MARGIN = 0.15
N = 16
SYSTEM = "You are a helpful assistant."
CANDIDATES = [
    "List the first ten prime numbers, separated by commas.",
    "Count from one to twenty in English words.",
    "Name the planets of the solar system in order from the Sun.",
    "Write a short poem about the sea.",
    "Explain what a CPU does in two sentences.",
]


def chat_ids(tok, user):
    text = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
    return text, tok(text, add_special_tokens=False)["input_ids"]


def greedy(model, ids):
    steps, past, inp = [], None, torch.tensor([ids])
    with torch.no_grad():
        for _ in range(N):
            out = model(inp, past_key_values=past, use_cache=True)
            past = out.past_key_values
            lp = torch.log_softmax(out.logits[0, -1].float(), -1)
            v, ix = lp.topk(2)
            steps.append({"token": int(ix[0]), "logprob": float(v[0]), "margin": float(v[0] - v[1])})
            inp = ix[:1].view(1, 1)
    return steps


def main():
    path = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32).eval()
    tried = []
    for user in CANDIDATES:
        text, ids = chat_ids(tok, user)
        steps = greedy(model, ids)
        margin = min(s["margin"] for s in steps)
        tried.append({"user": user, "min_margin": round(margin, 4)})
        eos = any(s["token"] == tok.eos_token_id for s in steps)
        if margin >= MIN_MARGIN and not eos:
            out = {"generated_by": "scripts/gen_smollm2_reference.py", "min_margin_required": MIN_MARGIN,
                   "system": SYSTEM, "user": user, "prompt_text": text, "prompt_ids": ids,
                   "steps": steps, "candidates_tried": tried}
            dst = os.path.join(os.path.dirname(__file__), "..", "__test__", "fixtures", "smollm2-reference.json")
            with open(dst, "w") as fh:
                json.dump(out, fh, indent=1)
            print(f"chose {user!r} (min margin {margin:.3f}); tried {tried}")
            return
    sys.exit(f"no candidate reaches a {MIN_MARGIN} margin over {N} steps: {tried}")


if __name__ == "__main__":
    main()
