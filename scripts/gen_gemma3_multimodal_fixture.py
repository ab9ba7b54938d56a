#!/usr/bin/env python3
"""Generate __test__/fixtures/gemma3-mm-tiny/: the text model of gemma3-tiny inside a multimodal
Gemma 3 checkpoint (model_type "gemma3", Gemma3ForConditionalGeneration), as a user brings
google/gemma-3-4b-it, plus two LoRA experts trained on that checkpoint and PEFT's references.

Run:   python scripts/gen_gemma3_multimodal_fixture.py   (after gen_gemma3_fixtures.py)
       (any venv with scripts/requirements-fixtures.txt; written with torch 2.15.0,
       transformers 5.24.0, peft 0.21.2 -- ~/.cache/expert-runtime/bench-venv)

Seeded, single-threaded CPU, deterministic.

  * Gemma3ForConditionalGeneration with gemma3-tiny's text config and text weights, and a tiny
    SigLIP vision tower (1 layer, hidden 32) and projector, both seeded random. Text-only input
    never reaches them: the script checks that this model's greedy decode equals gemma3-tiny's
    text model's (same tokens, |dlogprob| < 1e-5) without its final_logit_softcapping, which
    transformers' Gemma3ForConditionalGeneration does not apply (and the runtime refuses in a
    multimodal config).
  * Saved by transformers' save_pretrained (tensor names language_model.model.*, vision_tower.*,
    multi_modal_projector.*). config.json's text_config is then cut down to the fields that
    differ from Gemma3TextConfig's defaults, as the configs of the published multimodal
    checkpoints are (google/gemma-3-4b-it's text_config names 7 fields): a reader must apply
    transformers' defaults for the rest (here: rope_parameters, max_position_embeddings,
    rms_norm_eps, ...). The script reloads the cut-down config and checks the decode again.
  * lora/: LoRA r=4 on q/k/v/o/gate/up/down by name, which PEFT also applies to the vision
    tower's q/k/v projections (adapter tensors under base_model.model.model.vision_tower.*).
    lora_regex/: LoRA r=2 on a regex over the language model's attention only, the way
    multimodal fine-tunes keep the vision tower out.
  * reference.json: {"cases": {name: {experts, prompt_ids, steps}}} in the schema of
    adapters/reference.json, on gemma3-tiny's 25-token prompt (3x the 8-token window), 12 new
    tokens, from PEFT over this checkpoint.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import Gemma3Config, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Gemma3TextConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_adapters import N_NEW, acceptable, randomize, reference, save_adapter  # noqa: E402
from gen_fixtures import dump_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "__test__" / "fixtures"
SRC = FIX / "gemma3-tiny"
OUT = FIX / "gemma3-mm-tiny"
NAME = "gemma3-mm-tiny"

VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
              image_size=28, patch_size=14)
# Image placeholders past the text vocabulary (transformers maps such ids to 0 before the text
# embedding): no text prompt contains them.
IMAGE_IDS = dict(image_token_index=1000, boi_token_index=1001, eoi_token_index=1002)

ADAPTERS = [
    dict(name="lora", seed=1900, config=dict(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])),
    dict(name="lora_regex", seed=1950, config=dict(
        r=2, lora_alpha=4, target_modules=r".*language_model.*\.self_attn\.(q_proj|k_proj|v_proj|o_proj)")),
]
MAX_SEED_TRIES = 100


def load_multimodal(path: Path) -> Gemma3ForConditionalGeneration:
    return Gemma3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32,
                                                          attn_implementation="eager").eval()


def toks(steps):
    return [s["token"] for s in steps]


def same_decode(a, b, tol=1e-5):
    assert toks(a) == toks(b), (toks(a), toks(b))
    worst = max(abs(x["logprob"] - y["logprob"]) for x, y in zip(a, b))
    assert worst < tol, worst
    return worst


def sparse_text_config(text_config: dict) -> dict:
    """The fields of `text_config` that differ from Gemma3TextConfig's defaults (model_type kept)."""
    defaults = Gemma3TextConfig().to_dict()
    keep = {k: v for k, v in text_config.items() if k == "model_type" or defaults.get(k, object()) != v}
    for k in ("_sliding_window_pattern", "_name_or_path", "architectures", "dtype"):
        keep.pop(k, None)
    return keep


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    text = Gemma3ForCausalLM.from_pretrained(SRC, dtype=torch.float32, attn_implementation="eager").eval()
    prompt_ids = json.loads((SRC / "reference.json").read_text())["prompt_ids"]
    # Gemma3ForConditionalGeneration never applies final_logit_softcapping (Gemma3ForCausalLM
    # does; the published checkpoints set none): the runtime refuses a multimodal config that
    # sets it, so this one has none.
    text.config.final_logit_softcapping = None
    text_steps, _ = reference(text, prompt_ids)

    cfg = Gemma3Config(text_config=text.config.to_dict(), vision_config=VISION, mm_tokens_per_image=1, **IMAGE_IDS)
    torch.manual_seed(7)
    mm = Gemma3ForConditionalGeneration(cfg).to(torch.float32).eval()
    with torch.no_grad():
        missing = mm.model.language_model.load_state_dict(text.model.state_dict(), strict=True)
        assert not missing.missing_keys and not missing.unexpected_keys, missing
    assert mm.lm_head.weight.data_ptr() == mm.model.language_model.embed_tokens.weight.data_ptr()
    mm.config._attn_implementation = "eager"
    mm.config.text_config._attn_implementation = "eager"
    mm_steps, _ = reference(mm, prompt_ids)
    print(f"multimodal vs text model: max |dlogprob| {same_decode(mm_steps, text_steps):.2e}")

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    mm.save_pretrained(OUT, safe_serialization=True)
    config = json.loads((OUT / "config.json").read_text())
    config["text_config"] = sparse_text_config(config["text_config"])
    dump_json(OUT / "config.json", config, sort_keys=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(SRC / f, OUT / f)
    print("text_config as written:", json.dumps(config["text_config"]))

    reloaded = load_multimodal(OUT)
    base_steps, _ = reference(reloaded, prompt_ids)
    same_decode(base_steps, text_steps)
    names = sorted(json.loads((OUT / "model.safetensors.index.json").read_text())["weight_map"]) \
        if (OUT / "model.safetensors.index.json").exists() else None
    assert names is None, "expected one model.safetensors"

    cases = {"base": {"experts": [], "prompt_ids": prompt_ids, "steps": base_steps}}
    for spec in ADAPTERS:
        for seed in range(spec["seed"], spec["seed"] + MAX_SEED_TRIES):
            pm = get_peft_model(load_multimodal(OUT), LoraConfig(init_lora_weights=False, **spec["config"]))
            randomize(pm, seed)
            steps, margin = reference(pm.eval(), prompt_ids)
            ok, n_diff = acceptable(steps, margin, base_steps)
            if ok:
                break
        else:
            raise SystemExit(f"{spec['name']}: no acceptable seed")
        d = OUT / spec["name"]
        save_adapter(pm, d, NAME)
        from safetensors import safe_open
        with safe_open(d / "adapter_model.safetensors", "pt") as f:
            keys = list(f.keys())
        vision = [k for k in keys if ".vision_tower." in k]
        text_keys = [k for k in keys if ".language_model." in k]
        assert len(vision) + len(text_keys) == len(keys), keys
        assert (len(vision) > 0) == (spec["name"] == "lora"), vision
        print(f"{spec['name']}: seed {seed}, {n_diff}/{N_NEW} tokens differ from the base, min margin {margin:.3f}, "
              f"{len(text_keys)} language-model tensors, {len(vision)} vision-tower tensors")
        cases[spec["name"]] = {"experts": [spec["name"]], "seed": seed, "prompt_ids": prompt_ids, "steps": steps}
    dump_json(OUT / "reference.json", {"model": NAME, "cases": cases}, compact_lists=True)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"{OUT.relative_to(ROOT)}: total {total / 1e3:.0f} KB")


if __name__ == "__main__":
    main()
