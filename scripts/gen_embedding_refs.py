#!/usr/bin/env python3
"""Generate __test__/fixtures/embeddings.json: HF transformers reference sentence embeddings.

Run:   /work/cache/venv/bin/python scripts/gen_embedding_refs.py
       (after scripts/gen_fixtures.py and scripts/gen_adapters.py; any venv with
       scripts/requirements-fixtures.txt installed works)

No randomness is involved; it runs single-threaded on CPU with deterministic algorithms, so a
re-run with the same package versions reproduces the file byte for byte.

For each tiny fixture model (qwen3-tiny, qwen2-tiny, llama-tiny) and each of TEXTS (four texts of
clearly different lengths, one with non-ASCII characters):
  * ids  = AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"] (the tokenizer's default
           special tokens, i.e. add_special_tokens=True; the fixture tokenizer adds none: no BOS,
           no EOS, so these are the same ids as with add_special_tokens=False);
  * the model is loaded with AutoModelForCausalLM in float32 with eager attention, and its inner
    decoder is run on that one text alone (batch 1, no padding, no attention mask):
        h = model.model(input_ids=ids).last_hidden_state[0]        # [T, hidden], after the final RMSNorm
  * mean = h.mean(0), last = h[-1]; both NOT normalized (consumers L2-normalize themselves).
The same is done for the `adapters/lora` PEFT adapter on its base (qwen3-tiny), loaded with
PeftModel.from_pretrained(base, dir); the inner decoder with the LoRA layers active is
peft_model.base_model.model.model.

Layout:
  {
    "generated_by": "scripts/gen_embedding_refs.py",
    "versions": {"torch": ..., "transformers": ..., "peft": ...},
    "models": {
      "<model dir>": {"hidden_size": H,
                      "texts": [{"text": str, "ids": [int], "mean": [H floats], "last": [H floats]}, x4]},
      ...                                                  // qwen3-tiny, qwen2-tiny, llama-tiny
    },
    "adapters": {
      "lora": {"base": "qwen3-tiny", "texts": [same shape as above, same texts and ids]}
    }
  }
Floats are the shortest decimal that round-trips to the same float32 (lossless).

Self-checks: every vector has hidden_size finite entries; the ids are the same for every model;
model.model's last_hidden_state equals the full model's last hidden_states entry and feeds the LM
head (lm_head(h) == logits); the loaded LoRA reproduces the first step of its case in
adapters/reference.json; the LoRA embeddings differ from the base ones.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

import peft
import transformers
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_fixtures import dump_json, f32  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "__test__" / "fixtures"
OUT = FIX / "embeddings.json"

MODELS = ["qwen3-tiny", "qwen2-tiny", "llama-tiny"]
ADAPTER = "lora"          # adapters/lora, built on qwen3-tiny by scripts/gen_adapters.py
ADAPTER_BASE = "qwen3-tiny"

TEXTS = [
    # 1 word
    "Hello",
    # one sentence, with non-ASCII (Latin-1 accents, the euro sign, an em dash)
    "Ça coûte 5 € — naïve café prices in the old village.",
    # ~45 words
    "The quick brown fox jumps over the lazy dog. The dog did not mind; it was a warm afternoon, "
    "and the sun was low over the hills. In the village, the baker opened the doors of the small "
    "shop and the first customers came in for bread.",
    # ~130 words
    "Once upon a time there was a little robot that wanted to learn how to read. It read the signs "
    "on the street, the labels on the boxes and the names on the doors. Every morning it walked to "
    "the old school at the end of the road and waited for the teacher to arrive. \"What is this "
    "word?\" it asked her one day, pointing at a sign above a green door. \"That is the word for "
    "home,\" she said, and the robot smiled for the first time. From then on it read everything it "
    "could find: books, letters, maps and menus. Years later, people in the village still told the "
    "story of the robot that learned to read, and the children asked to hear it again every night.",
]

MIN_ADAPTER_DIFF = 1e-3   # max |lora - base| over a text's mean vector must exceed this


def load(model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def vec(t: torch.Tensor, hidden: int) -> list:
    assert t.shape == (hidden,), t.shape
    out = [f32(x) for x in t.tolist()]
    assert all(math.isfinite(x) for x in out), "NaN/inf in embedding"
    return out


@torch.no_grad()
def embed(full_model, decoder, ids: list, hidden: int) -> dict:
    """full_model: the causal-LM wrapper (for the cross-checks); decoder: its inner base model."""
    x = torch.tensor([ids], dtype=torch.long)
    h = decoder(input_ids=x).last_hidden_state[0]                     # [T, hidden], post final norm
    assert h.shape == (len(ids), hidden) and h.dtype == torch.float32, (h.shape, h.dtype)
    # cross-checks: same tensor as the full model's last hidden state, and it is what the LM head reads
    full = full_model(input_ids=x, output_hidden_states=True)
    torch.testing.assert_close(full.hidden_states[-1][0], h, rtol=0, atol=0)
    lm_head = full_model.get_output_embeddings()
    torch.testing.assert_close(lm_head(h), full.logits[0].float(), rtol=1e-5, atol=1e-5)
    return {"mean": vec(h.mean(dim=0), hidden), "last": vec(h[-1], hidden)}


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    out = {
        "generated_by": "scripts/gen_embedding_refs.py",
        "versions": {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
                     "peft": peft.__version__},
        "models": {},
        "adapters": {},
    }

    ids_by_text = None
    for name in MODELS:
        d = FIX / name
        tok = AutoTokenizer.from_pretrained(d)
        ids = [tok(t)["input_ids"] for t in TEXTS]
        ids_plain = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
        if ids != ids_plain:
            print(f"{name}: NOTE the tokenizer adds special tokens by default")
        for t, i in zip(TEXTS, ids):
            assert tok.decode(i, skip_special_tokens=True) == t, (name, t)
        if ids_by_text is None:
            ids_by_text = ids
        assert ids == ids_by_text, f"{name}: different ids than {MODELS[0]}"

        model = load(d)
        hidden = model.config.hidden_size
        max_pos = model.config.max_position_embeddings
        assert all(len(i) <= max_pos for i in ids)
        texts = []
        for t, i in zip(TEXTS, ids):
            texts.append({"text": t, "ids": i, **embed(model, model.model, i, hidden)})
        out["models"][name] = {"hidden_size": hidden, "texts": texts}
        print(f"{name}: hidden {hidden}, tokens per text {[len(i) for i in ids]}")

    # ---- one LoRA adapter through PEFT ----
    base_rec = out["models"][ADAPTER_BASE]
    cfg = json.loads((FIX / "adapters" / ADAPTER / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["base_model_name_or_path"].endswith(ADAPTER_BASE), cfg
    pm = PeftModel.from_pretrained(load(FIX / ADAPTER_BASE), FIX / "adapters" / ADAPTER).eval()
    full = pm.base_model.model                      # the (LoRA-injected) Qwen3ForCausalLM
    decoder = full.model
    n_lora = sum(1 for m in decoder.modules() if hasattr(m, "lora_A") and len(m.lora_A) > 0)
    assert n_lora > 0, "no LoRA layers injected"
    # the adapter loaded as gen_adapters.py recorded it: first greedy step of its reference case
    case = json.loads((FIX / "adapters" / "reference.json").read_text())["cases"][ADAPTER]
    assert case["base"] == ADAPTER_BASE and case["experts"] == [ADAPTER], case["base"]
    with torch.no_grad():
        h = decoder(input_ids=torch.tensor([case["prompt_ids"]])).last_hidden_state[0, -1]
        lp = torch.log_softmax(full.get_output_embeddings()(h), dim=-1)
    for tid, ref_lp in case["steps"][0]["top5"]:
        assert abs(float(lp[tid]) - ref_lp) < 1e-4, (tid, float(lp[tid]), ref_lp)
    hidden = base_rec["hidden_size"]
    texts = []
    for brec in base_rec["texts"]:
        rec = {"text": brec["text"], "ids": brec["ids"], **embed(full, decoder, brec["ids"], hidden)}
        diff = max(abs(a - b) for a, b in zip(rec["mean"], brec["mean"]))
        assert diff > MIN_ADAPTER_DIFF, f"LoRA embedding equals the base one (max diff {diff})"
        texts.append(rec)
    out["adapters"][ADAPTER] = {"base": ADAPTER_BASE, "texts": texts}
    print(f"adapter {ADAPTER} (base {ADAPTER_BASE}): {n_lora} LoRA layers, "
          f"max |lora-base| of the means per text "
          f"{[round(max(abs(a - b) for a, b in zip(r['mean'], b_['mean'])), 4) for r, b_ in zip(texts, base_rec['texts'])]}")

    dump_json(OUT, out, compact_lists=True)
    size = OUT.stat().st_size
    assert size < 300_000, size
    print(f"wrote {OUT.relative_to(ROOT)} ({size} bytes)")


if __name__ == "__main__":
    main()
