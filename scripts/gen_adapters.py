#!/usr/bin/env python3
"""Generate the committed PEFT adapter fixtures under __test__/fixtures/adapters/.

Run:   /work/cache/venv/bin/python scripts/gen_adapters.py
       (after scripts/gen_fixtures.py; any venv with scripts/requirements-fixtures.txt works)

For every adapter kind the runtime supports (LoRA, rsLoRA, rank/alpha patterns, DoRA, IA3,
LoKr, prompt tuning) it builds a PEFT adapter on one of the tiny fixture models, overwrites
every trainable adapter parameter with seeded random values (PEFT's default init is an
identity / zero delta), saves it with PEFT's own `save_pretrained`, loads it back from disk
with `PeftModel.from_pretrained` and records a greedy float32 reference computed by PEFT.

Everything is seeded and runs single-threaded on CPU; the script re-executes itself with
PYTHONHASHSEED=0 because PEFT writes `target_modules` (a Python set) in set-iteration order.
A re-run with the same package versions reproduces the files byte for byte.

See __test__/fixtures/README.md ("PEFT adapters") for the layout.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":  # deterministic set order in adapter_config.json
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import json
import shutil
from pathlib import Path

import torch

import peft
from peft import (IA3Config, LoKrConfig, LoraConfig, PeftModel, PromptTuningConfig,
                  get_peft_model)
from peft.tuners.ia3.layer import IA3Layer
from peft.tuners.lokr.layer import LoKrLayer
from peft.tuners.lora.layer import LoraLayer
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_fixtures import _lp_record, dump_json, f32  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "__test__" / "fixtures"
OUT = FIX / "adapters"

N_NEW = 12
MAX_SEED_TRIES = 100
SELECT_MARGIN = 0.02   # seeds are picked so that top-1/top-2 >= this at every step
ASSERT_MARGIN = 0.01
MIN_DIFF_STEPS = 3     # adapter's greedy tokens differ from the base's on >= this many steps
MIN_DISTINCT = 5       # no collapse into one repeated token ...
MAX_REPEAT = 4         # ... and no token more than this often
SPECIAL_MIN_ID = 395   # ids >= 395 are special/added tokens

ALL7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CL = "CAUSAL_LM"

# delta_W target: per-entry std of the adapter's weight delta relative to the base weight's std
DELTA_RATIO = 0.5

ADAPTERS = [
    # ---------------- qwen3-tiny ----------------
    dict(name="lora", base="qwen3-tiny", seed=100, manifest=True,
         cfg=lambda: LoraConfig(task_type=CL, r=4, lora_alpha=8, target_modules=ALL7,
                                init_lora_weights=False)),
    dict(name="lora2", base="qwen3-tiny", seed=200, compose_with="lora",
         cfg=lambda: LoraConfig(task_type=CL, r=2, lora_alpha=4,
                                target_modules=["q_proj", "v_proj", "down_proj"],
                                init_lora_weights=False)),
    # PEFT forbids layers_to_transform with a regex target_modules, so the regex itself selects
    # layers 0 and 2.
    dict(name="rslora", base="qwen3-tiny", seed=300,
         cfg=lambda: LoraConfig(task_type=CL, r=8, lora_alpha=4, use_rslora=True,
                                target_modules=r".*\.layers\.(0|2)\.(self_attn\.(q_proj|v_proj)|mlp\.up_proj)",
                                init_lora_weights=False)),
    dict(name="lora_patterns", base="qwen3-tiny", seed=400,
         cfg=lambda: LoraConfig(task_type=CL, r=4, lora_alpha=8,
                                target_modules=["q_proj", "k_proj", "v_proj", "up_proj", "down_proj"],
                                layers_to_transform=[1, 2],
                                rank_pattern={"v_proj": 2, "model.layers.1.self_attn.q_proj": 6},
                                alpha_pattern={"up_proj": 3},
                                init_lora_weights=False)),
    dict(name="dora", base="qwen3-tiny", seed=500,
         cfg=lambda: LoraConfig(task_type=CL, r=4, lora_alpha=8, use_dora=True, target_modules=ALL7,
                                init_lora_weights=False)),
    dict(name="ia3", base="qwen3-tiny", seed=600,
         cfg=lambda: IA3Config(task_type=CL, target_modules=["k_proj", "v_proj", "down_proj"],
                               feedforward_modules=["down_proj"])),
    dict(name="lokr", base="qwen3-tiny", seed=700,
         cfg=lambda: LoKrConfig(task_type=CL, r=4, alpha=8, target_modules=ALL7)),
    dict(name="lokr_both", base="qwen3-tiny", seed=800,
         cfg=lambda: LoKrConfig(task_type=CL, r=2, alpha=3, decompose_both=True, target_modules=ALL7)),
    dict(name="prompt", base="qwen3-tiny", seed=900, prompt=True,
         cfg=lambda: PromptTuningConfig(task_type=CL, num_virtual_tokens=4,
                                        prompt_tuning_init="RANDOM")),
    # ---------------- qwen2-tiny (q/k/v bias) ----------------
    dict(name="ia3_qwen2", base="qwen2-tiny", seed=1000,
         cfg=lambda: IA3Config(task_type=CL, target_modules=["q_proj", "k_proj", "up_proj", "down_proj"],
                               feedforward_modules=["down_proj", "up_proj"])),
    dict(name="lora_qwen2", base="qwen2-tiny", seed=1100,
         cfg=lambda: LoraConfig(task_type=CL, r=4, lora_alpha=8,
                                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                init_lora_weights=False)),
    # ---------------- llama-tiny (q/k rows permuted in its GGUFs) ----------------
    dict(name="lora_llama", base="llama-tiny", seed=1200,
         cfg=lambda: LoraConfig(task_type=CL, r=4, lora_alpha=8, target_modules=ALL7,
                                init_lora_weights=False)),
    dict(name="dora_llama", base="llama-tiny", seed=1300,
         cfg=lambda: LoraConfig(task_type=CL, r=4, lora_alpha=8, use_dora=True,
                                target_modules=["q_proj", "k_proj", "v_proj"],
                                init_lora_weights=False)),
    # ---------------- gemma3-tiny (sliding window 8, sandwich norms, GELU-tanh MLP) ----------------
    dict(name="lora_gemma3", base="gemma3-tiny", seed=1400,
         cfg=lambda: LoraConfig(task_type=CL, r=4, lora_alpha=8, target_modules=ALL7,
                                init_lora_weights=False)),
    dict(name="dora_gemma3", base="gemma3-tiny", seed=1500,
         cfg=lambda: LoraConfig(task_type=CL, r=4, lora_alpha=8, use_dora=True, target_modules=ALL7,
                                init_lora_weights=False)),
    dict(name="ia3_gemma3", base="gemma3-tiny", seed=1600,
         cfg=lambda: IA3Config(task_type=CL, target_modules=ALL7, feedforward_modules=["down_proj"])),
    # ---------------- mistral-tiny (every layer sliding, window 6) ----------------
    dict(name="lora_mistral", base="mistral-tiny", seed=1700,
         cfg=lambda: LoraConfig(task_type=CL, r=4, lora_alpha=8, target_modules=ALL7,
                                init_lora_weights=False)),
    dict(name="dora_mistral", base="mistral-tiny", seed=1800,
         cfg=lambda: LoraConfig(task_type=CL, r=4, lora_alpha=8, use_dora=True, target_modules=ALL7,
                                init_lora_weights=False)),
    dict(name="ia3_mistral", base="mistral-tiny", seed=1900,
         cfg=lambda: IA3Config(task_type=CL, target_modules=ALL7, feedforward_modules=["down_proj"])),
]

# Bases whose own reference.json decodes the shared 12-token prompt (the others' references use
# longer prompts; on them the shared prompt runs past the sliding window within its 12 new tokens).
SHARED_PROMPT_BASES = ("qwen3-tiny", "qwen2-tiny", "llama-tiny")

LORA_MANIFEST = {
    "name": "lora", "description": "test LoRA", "version": "1.0.0", "load_order": 0,
    "routing": {"keywords": ["sql"], "exclude_keywords": [], "priority": 1},
}


# --------------------------------------------------------------------------------------

def load_base(base: str):
    return AutoModelForCausalLM.from_pretrained(FIX / base, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def _rescale_factors(factors, delta, target):
    """factors: adapter tensors whose (multi-linear) product is `delta`; scale all equally so
    that std(delta) == target."""
    k = len(factors)
    c = (target / float(delta.std())) ** (1.0 / k)
    for p in factors:
        p.mul_(c)


@torch.no_grad()
def randomize(model, seed: int):
    """Overwrite every trainable adapter parameter with seeded random values."""
    gen = torch.Generator().manual_seed(seed)
    touched = set()

    def rnd(p, std=1.0):
        p.copy_(std * torch.randn(p.shape, generator=gen))
        touched.add(id(p))

    for name, mod in model.named_modules():
        if isinstance(mod, LoraLayer) and "default" in mod.lora_A:
            W = mod.get_base_layer().weight
            A, B = mod.lora_A["default"].weight, mod.lora_B["default"].weight
            rnd(A)
            rnd(B)
            s = mod.scaling["default"]
            _rescale_factors([A, B], s * (B @ A), DELTA_RATIO * float(W.std()))
            if mod.use_dora.get("default", False):
                mag = mod.lora_magnitude_vector["default"].weight
                norm = torch.linalg.norm(W + s * (B @ A), dim=1)
                u = torch.rand(mag.shape, generator=gen) * 2 - 1
                mag.copy_(norm * (1 + 0.3 * u))
                touched.add(id(mag))
        elif isinstance(mod, LoKrLayer) and "default" in mod.r:
            W = mod.get_base_layer().weight
            factors = []
            for pname in ("lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b", "lokr_t2"):
                pd = getattr(mod, pname)
                if "default" in pd:
                    rnd(pd["default"])
                    factors.append(pd["default"])
            _rescale_factors(factors, mod.get_delta_weight("default"), DELTA_RATIO * float(W.std()))
        elif isinstance(mod, IA3Layer) and "default" in mod.ia3_l:
            p = mod.ia3_l["default"]
            p.copy_((1 + 0.5 * torch.randn(p.shape, generator=gen)).clamp(min=0.1))
            touched.add(id(p))
    if hasattr(model, "prompt_encoder") and "default" in model.prompt_encoder:
        rnd(model.prompt_encoder["default"].embedding.weight, 0.5)

    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert trainable, "no trainable parameters"
    missed = [n for n, p in trainable if id(p) not in touched]
    assert not missed, missed


@torch.no_grad()
def decode(model, prompt_ids, use_cache: bool):
    """Greedy decoding of N_NEW tokens; float32 log_softmax records. With use_cache=False every
    step re-runs the full sequence (needed for prompt tuning, whose virtual tokens PEFT prepends
    inside forward)."""
    seq = list(prompt_ids)
    steps, margins = [], []
    past = None
    out = model(input_ids=torch.tensor([seq]), use_cache=use_cache)
    for i in range(N_NEW):
        lp = torch.log_softmax(out.logits[0, -1].float(), -1)
        tok = int(torch.argmax(lp))
        srt = torch.sort(lp, descending=True).values
        margins.append(float(srt[0] - srt[1]))
        steps.append({"token": tok, "logprob": f32(lp[tok]), "top5": _lp_record(lp)})
        seq.append(tok)
        if i + 1 == N_NEW:
            break
        if use_cache:
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=out.past_key_values, use_cache=True)
        else:
            out = model(input_ids=torch.tensor([seq]), use_cache=False)
    return steps, margins


def reference(model, prompt_ids, prompt_tuning=False):
    steps, margins = decode(model, prompt_ids, use_cache=not prompt_tuning)
    if not prompt_tuning:  # cross-check the cached decode against full re-runs
        steps2, _ = decode(model, prompt_ids, use_cache=False)
        assert [s["token"] for s in steps] == [s["token"] for s in steps2]
        worst = max(abs(a["logprob"] - b["logprob"]) for a, b in zip(steps, steps2))
        assert worst < 1e-4, worst
    return steps, min(margins)


def toks(steps):
    return [s["token"] for s in steps]


def acceptable(steps, margin, base_steps):
    t = toks(steps)
    n_diff = sum(a != b for a, b in zip(t, toks(base_steps)))
    return (margin >= SELECT_MARGIN and n_diff >= MIN_DIFF_STEPS and len(set(t)) >= MIN_DISTINCT
            and max(t.count(x) for x in t) <= MAX_REPEAT and max(t) < SPECIAL_MIN_ID), n_diff


def save_adapter(pm, d: Path, base: str):
    if d.exists():
        shutil.rmtree(d)
    pm.peft_config["default"].base_model_name_or_path = f"__test__/fixtures/{base}"
    pm.save_pretrained(d)
    (d / "README.md").unlink(missing_ok=True)  # PEFT's auto-generated model card
    assert sorted(p.name for p in d.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"], \
        list(d.iterdir())


def load_from_disk(base: str, dirs: list[tuple[str, Path]]):
    model = load_base(base)
    (n0, d0), rest = dirs[0], dirs[1:]
    pm = PeftModel.from_pretrained(model, d0, adapter_name=n0 if rest else "default")
    for n, d in rest:
        pm.load_adapter(d, adapter_name=n)
    if rest:
        pm.base_model.set_adapter([n for n, _ in dirs])
        for mod in pm.modules():
            if isinstance(mod, LoraLayer) and len(mod.lora_A) > 1:
                assert sorted(mod.active_adapters) == sorted(n for n, _ in dirs), mod.active_adapters
    return pm.eval()


def describe_keys(d: Path):
    from safetensors import safe_open
    with safe_open(d / "adapter_model.safetensors", "pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}


# The experts every newer family's fixture carries in its own experts/ (gen_family_experts.py,
# gen_granite_fixtures.py, gen_phi3_fixtures.py): LoRA, DoRA, IA3 and prompt tuning. `cfg` takes the
# target module names and IA3's feed-forward ones (write_family_experts: all 7 projections, down).
FAMILY_EXPERTS = [
    dict(name="lora", seed=100, cfg=lambda t, ff: LoraConfig(task_type=CL, r=4, lora_alpha=8, target_modules=t,
                                                             init_lora_weights=False)),
    dict(name="dora", seed=200, cfg=lambda t, ff: LoraConfig(task_type=CL, r=4, lora_alpha=8, use_dora=True,
                                                             target_modules=t, init_lora_weights=False)),
    dict(name="ia3", seed=300, cfg=lambda t, ff: IA3Config(task_type=CL, target_modules=t, feedforward_modules=ff)),
    dict(name="prompt", seed=400, prompt=True,
         cfg=lambda t, ff: PromptTuningConfig(task_type=CL, num_virtual_tokens=4, prompt_tuning_init="RANDOM")),
]


def write_family_experts(model_dir: Path, name: str, prompt_ids, *, targets=ALL7, feedforward=("down_proj",),
                         kinds=None):
    """FAMILY_EXPERTS trained by PEFT on the model saved in `model_dir`, written to its experts/
    with experts/reference.json: PEFT's greedy steps for the base and each expert (the schema of
    adapters/reference.json). `targets`: the modules LoRA, DoRA and IA3 adapt; `feedforward`: those
    IA3 scales at their input (a family with other projection names passes its own); `kinds`: the
    FAMILY_EXPERTS names to write (default all; gemma4-tiny leaves out prompt tuning)."""
    load = lambda: AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,  # noqa: E731
                                                        attn_implementation="eager").eval()
    base_steps, _ = reference(load(), prompt_ids)
    cases = {"base": {"experts": [], "prompt_ids": prompt_ids, "steps": base_steps}}
    for spec in FAMILY_EXPERTS:
        if kinds is not None and spec["name"] not in kinds:
            continue
        is_prompt = spec.get("prompt", False)
        for seed in range(spec["seed"], spec["seed"] + MAX_SEED_TRIES):
            torch.manual_seed(seed)
            pm = get_peft_model(load(), spec["cfg"](targets, list(feedforward)))
            randomize(pm, seed)
            steps, margin = reference(pm.eval(), prompt_ids, is_prompt)
            ok, n_diff = acceptable(steps, margin, base_steps)
            if ok:
                break
        else:
            raise SystemExit(f"{spec['name']}: no acceptable seed")
        save_adapter(pm, model_dir / "experts" / spec["name"], name)
        cases[spec["name"]] = {"experts": [spec["name"]], "seed": seed, "prompt_ids": prompt_ids, "steps": steps}
        print(f"  expert {spec['name']}: seed {seed}, {n_diff}/{len(steps)} tokens differ from the base, "
              f"min margin {margin:.3f}")
    dump_json(model_dir / "experts" / "reference.json", {"model": name, "cases": cases}, compact_lists=True)


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    OUT.mkdir(parents=True, exist_ok=True)

    base_refs = {}
    cases = {}
    prompt_ids = None
    for base in SHARED_PROMPT_BASES + ("gemma3-tiny", "mistral-tiny"):
        bref = json.loads((FIX / base / "reference.json").read_text())
        if base in SHARED_PROMPT_BASES:
            prompt_ids = bref["prompt_ids"] if prompt_ids is None else prompt_ids
            assert bref["prompt_ids"] == prompt_ids
        steps, margin = reference(load_base(base), prompt_ids)
        if base in SHARED_PROMPT_BASES:
            assert toks(steps) == toks(bref["f32"]["steps"])[:N_NEW], base
        base_refs[base] = steps
        cases[base] = {"base": base, "experts": [], "prompt_ids": prompt_ids,
                       "min_margin": round(margin, 6), "steps": steps}
        print(f"{base}: base tokens={toks(steps)} min margin={margin:.4f}")

    for spec in ADAPTERS:
        name, base = spec["name"], spec["base"]
        d = OUT / name
        is_prompt = spec.get("prompt", False)
        for attempt in range(MAX_SEED_TRIES):
            seed = spec["seed"] + attempt
            torch.manual_seed(seed)
            pm = get_peft_model(load_base(base), spec["cfg"]())
            randomize(pm, seed)
            pm.eval()
            save_adapter(pm, d, base)
            mem_steps, _ = decode(pm, prompt_ids, use_cache=not is_prompt)
            # the reference is computed from the files on disk
            steps, margin = reference(load_from_disk(base, [(name, d)]), prompt_ids, is_prompt)
            assert steps == mem_steps, name
            ok, n_diff = acceptable(steps, margin, base_refs[base])
            comp = None
            if ok and spec.get("compose_with"):
                other = spec["compose_with"]
                pc = load_from_disk(base, [(other, OUT / other), (name, d)])
                c_steps, c_margin = reference(pc, prompt_ids)
                c_ok, c_diff = acceptable(c_steps, c_margin, base_refs[base])
                # really both active: differs from each adapter alone
                differs = toks(c_steps) != toks(cases[other]["steps"]) and toks(c_steps) != toks(steps)
                ok = c_ok and differs
                comp = (f"{other}+{name}", [other, name], c_steps, c_margin)
            if ok:
                break
        else:
            raise SystemExit(f"{name}: no acceptable seed found")
        cases[name] = {"base": base, "experts": [name], "seed": seed, "prompt_ids": prompt_ids,
                       "min_margin": round(margin, 6), "steps": steps}
        print(f"{name}: seed={seed} (attempt {attempt}) tokens={toks(steps)} "
              f"differs from base on {n_diff}/{N_NEW} steps, min margin={margin:.4f}")
        if comp:
            cname, experts, c_steps, c_margin = comp
            cases[cname] = {"base": base, "experts": experts, "prompt_ids": prompt_ids,
                            "min_margin": round(c_margin, 6), "steps": c_steps}
            print(f"{cname}: tokens={toks(c_steps)} min margin={c_margin:.4f}")
        if spec.get("manifest"):
            cfg = json.loads((FIX / base / "config.json").read_text())
            manifest = dict(LORA_MANIFEST, base_model={"architecture": cfg["model_type"],
                                                       "hidden_size": cfg["hidden_size"],
                                                       "num_layers": cfg["num_hidden_layers"]})
            dump_json(d / "manifest.json", manifest)
        keys = describe_keys(d)
        first = sorted(keys)[:3]
        print(f"  {len(keys)} tensors, e.g. " + ", ".join(f"{k} {keys[k]}" for k in first))

    for c in cases.values():
        assert c["min_margin"] >= ASSERT_MARGIN, c

    # sanity checks on the structure of the generated files
    lb = describe_keys(OUT / "lokr_both")
    assert any(k.endswith("lokr_w1_a") for k in lb) and any(k.endswith("lokr_w1_b") for k in lb), sorted(lb)
    lk = describe_keys(OUT / "lokr")
    assert any(k.endswith("lokr_w1") for k in lk)
    assert any(k.endswith("lokr_w2") for k in lk) and any(k.endswith("lokr_w2_a") for k in lk), sorted(lk)
    assert any(k.endswith("lora_magnitude_vector") for k in describe_keys(OUT / "dora"))
    lp = describe_keys(OUT / "lora_patterns")
    assert lp["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"] == [6, 64]
    assert lp["base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight"] == [4, 64]
    assert lp["base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"] == [2, 64]
    assert not any(".layers.0." in k for k in lp)
    rs = describe_keys(OUT / "rslora")
    assert not any(".layers.1." in k for k in rs) and len(rs) == 2 * 2 * 3

    ref = {"generated_by": "scripts/gen_adapters.py", "peft_version": peft.__version__,
           "n_new": N_NEW, "cases": cases}
    dump_json(OUT / "reference.json", ref, compact_lists=True)

    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"total adapter fixture size: {total / 1e6:.3f} MB")
    assert total < 1.5e6, total


if __name__ == "__main__":
    main()
