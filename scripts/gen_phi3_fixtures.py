#!/usr/bin/env python3
"""Generate __test__/fixtures/phi3-tiny/ and phi4-mini-tiny/: tiny random Phi-3-family models
(Phi-3-mini and Phi-4-mini style), their GGUFs as llama.cpp writes them, greedy references, and
PEFT experts on phi3-tiny.

Run:   python scripts/gen_phi3_fixtures.py   (needs `npm install` for node-llama-cpp)
       (any venv with scripts/requirements-fixtures.txt; written with torch 2.15.0,
       transformers 5.24.0, tokenizers 0.23.3, gguf 0.19.0, peft 0.21.2, node-llama-cpp 3.22.1
       -- ~/.cache/expert-runtime/bench-venv)

Seeded, single-threaded CPU, deterministic. Same layout and reference.json schema as granite-tiny
(see __test__/fixtures/README.md), shared tokenizer and Qwen3 chat template, no BOS, the 24-token
prompt of gen_mistral_fixtures.py with 16 new tokens. Both are `Phi3ForCausalLM` (model_type
"phi3"): hidden 64, ffn 96, 3 layers, 4 heads / 2 kv heads (head_dim 16), eager attention, f32,
RMSNorm weights 1 + 0.3*randn, fused weights as HF stores them: self_attn.qkv_proj ([q; k; v]
rows, 64 + 32 + 32) and mlp.gate_up_proj ([gate; up] rows, 96 + 96; down(up * silu(gate))).

  * phi3-tiny (Phi-3-mini): full rotary, default RoPE (theta 1e4), max_position_embeddings and
    original_max_position_embeddings 256, sliding_window 6 (HF's Phi3 applies it to every layer),
    untied embeddings. "ablations": HF's greedy run of the same weights with the window removed
    (sliding_window None: "no_window") and at 5 and 7; the seed is chosen so that each changes a
    token. experts/: LoRA and DoRA r=4 alpha=8 and IA3 on Phi-3's module names qkv_proj, o_proj,
    gate_up_proj, down_proj (IA3 feed-forward: gate_up_proj and down_proj, which it scales at
    their input, [1, in]; qkv_proj and o_proj at their output rows, [out, 1]), and prompt tuning
    (4 virtual tokens) -- gen_adapters.write_family_experts, experts/reference.json as
    granite-tiny's, but on the prompt's first 8 ids: through 3 layers of window 6 the last
    position of the 24-token prompt sees 15 positions back, never the virtual tokens at 0-3
    (prompt tuning could not change a token).
  * phi4-mini-tiny (Phi-4-mini): partial_rotary_factor 0.75 (NeoX rotation of the first 12 of 16
    dims), tied embeddings, no window, LongRoPE with 6 short and 6 long factors (FACTORS),
    max_position_embeddings 64, original_max_position_embeddings 16, so HF's attention factor is
    sqrt(1 + ln 4 / ln 16) (it multiplies cos and sin at every position, short or long). HF picks
    the factors by the current sequence length (highest position + 1 > 16: long), for the whole
    forward: the 24-token prompt runs on the long ones throughout (the f32 run is checked against
    a full recompute). "runs" adds incremental greedy references ({prompt_ids, n_new, steps},
    steps as in "f32"): "short", the first 6 prompt ids + 8 new (never past 16 positions: short
    factors only, checked against a recompute); "crossing", the first 10 + 12 new, decoded with
    the KV cache: HF switches to the long factors from the step at position 16 on, while the
    cached keys keep their short rotation, so it is not what a full recompute gives (by design;
    the generator checks that it differs, "recompute_differs": true, and that its first 7 steps
    equal a 16-position short recompute). Its "hf_generate" ({tokens, logprobs}) is what HF's
    generate() gives instead: Phi3ForCausalLM.prepare_inputs_for_generation drops the cache at the
    switch and re-runs the whole sequence on the long factors. "ablations" (f32, main prompt): "full_rotary"
    (partial_rotary_factor 1, the factor lists extended to 8 by FACTORS8), "default_rope" (no
    scaling), "short_factors" (long_factor := short_factor), "attention_factor_1"; the seed is
    chosen so that each of the first three changes a token and the last a token or a logprob by
    >= 0.01.
  * model-f32.gguf: general.architecture "phi3" as convert_hf_to_gguf.py's Phi3MiniModel writes
    it: token_embd, output_norm, output (phi3-tiny only; tied phi4-mini-tiny has none), per block
    attn_norm, attn_qkv (HF's fused rows, not permuted: phi3 is NeoX RoPE), attn_output, ffn_norm
    (post_attention_layernorm), ffn_up (HF's fused gate_up_proj, gate rows first), ffn_down;
    phi4-mini-tiny also rope_factors_long / rope_factors_short.weight (f32 [6]). Keys: phi3.
    context_length, rope.scaling.original_context_length, embedding_length, feed_forward_length,
    block_count, attention.head_count(_kv), attention.layer_norm_rms_epsilon,
    rope.dimension_count (int(partial_rotary_factor * n_embd) // n_head: 16 / 12), rope.freq_base,
    attention.sliding_window (6 / 0), phi4-mini-tiny also rope.scaling.attn_factor; plus
    new_gguf_writer's tokenizer keys and attention.key_length / value_length, vocab_size.
    general.name is "Phi 3 tiny" for phi3-tiny: llama.cpp's vocab loader looks up Phi-3's
    SentencePiece specials (</s>, <unk>, <s>) in a model whose name holds "phi3" or "phi-3", and
    refuses our vocab without them.
    "llamacpp" is node-llama-cpp's greedy decode of the file (scripts/llamacpp_greedy.mjs,
    context 64). phi4-mini-tiny: 64 > 16 makes llama.cpp use the long factors, and its tokens
    must equal HF's. phi3-tiny: llama.cpp disables Phi-3's window ("Phi SWA is currently
    disabled") and attends to everything, so its tokens must equal HF's "no_window" ablation
    (recorded as "llamacpp.reference"). It differs from HF's windowed reference from the first
    token on (the prompt is already 4 windows long): the file and its weights are right, and an
    engine that applies the window, as HF does, must disagree with llama.cpp on it.
"""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from transformers import AutoModelForCausalLM, Phi3Config, Phi3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_adapters import describe_keys, write_family_experts  # noqa: E402
from gen_fixtures import (ADDED_TOKENS, SPECIAL_TOKENS, build_tokenizer, check_recompute, dump_json,  # noqa: E402
                          f32 as as_f32, gguf_payload, greedy_reference, new_gguf_writer, sequence_ok)
from gen_gemma3_gguf_fixture import llamacpp_greedy  # noqa: E402
from gen_mistral_fixtures import PROMPT_LEN, PROMPT_TEXT, reference_runs, save_model_dir  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "__test__" / "fixtures"
N_NEW = 16
MAX_SEED_TRIES = 300

COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-5, initializer_range=0.2, hidden_act="silu",
              attention_dropout=0.0, use_cache=True)
# LongRoPE factors in the spirit of Phi-4-mini's: short ~1, long growing with the wavelength. The
# 8-long lists (for the full-rotary ablation) continue each trend; the model uses the first 6.
FACTORS8 = {"short_factor": [1.0, 1.02, 1.05, 1.1, 1.18, 1.3, 1.4, 1.5],
            "long_factor": [1.0, 1.25, 1.8, 2.7, 4.4, 7.5, 10.0, 13.0]}
FACTORS = {k: v[:6] for k, v in FACTORS8.items()}
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75, **FACTORS}

SPECS = {
    "phi3-tiny": dict(seed=11000, cfg=dict(
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, sliding_window=6,
        tie_word_embeddings=False, max_position_embeddings=256, original_max_position_embeddings=256)),
    "phi4-mini-tiny": dict(seed=12000, cfg=dict(
        rope_parameters=LONGROPE, sliding_window=None, tie_word_embeddings=True,
        max_position_embeddings=64, original_max_position_embeddings=16)),
}
PHI3_TARGETS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
PHI3_FEEDFORWARD = ["gate_up_proj", "down_proj"]
# Through 3 layers with window 6 the last prompt position sees 15 positions back: a 24-token prompt
# never sees prompt tuning's virtual tokens (positions 0-3). The experts decode the first 8 ids.
EXPERT_PROMPT_LEN = 8
PHI4_ABLATIONS = {
    "full_rotary": {**LONGROPE, "partial_rotary_factor": 1.0, **FACTORS8},
    "default_rope": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
    "short_factors": {**LONGROPE, "long_factor": FACTORS["short_factor"]},
    "attention_factor_1": {**LONGROPE, "attention_factor": 1.0},
}
RUNS = {"short": (6, 8), "crossing": (10, 12)}  # (prompt prefix length, new tokens)
# general.name: llama.cpp's vocab loader gives a model whose name holds "phi3" or "phi-3" the special
# tokens of Phi-3's SentencePiece vocab (</s>, <unk>, <s>), which ours lacks; it refuses the file.
GGUF_NAMES = {"phi3-tiny": "Phi 3 tiny", "phi4-mini-tiny": "phi4-mini-tiny"}


def build_model(cfg: dict, seed: int, vocab_size: int, ids: dict, **overrides) -> Phi3ForCausalLM:
    config = Phi3Config(**copy.deepcopy({**COMMON, **cfg, **overrides}), vocab_size=vocab_size,
                        pad_token_id=ids["<|endoftext|>"], bos_token_id=None,
                        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]])
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Phi3ForCausalLM(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for mod in model.modules():
            if type(mod).__name__.endswith("RMSNorm"):
                mod.weight.copy_(1.0 + 0.3 * torch.randn(mod.weight.shape, generator=gen))
    return model


def toks(r):
    return [s["token"] for s in r["steps"]]


def record(r):
    return {"tokens": toks(r), "logprobs": [s["logprob"] for s in r["steps"]]}


def acceptable(r, margins, bad, min_distinct=6) -> bool:
    t = toks(r)
    return sequence_ok(r["steps"], margins, bad, min_distinct=min_distinct) and max(t.count(x) for x in t) <= 4


def phi3_ablations(model, prompt_ids):
    """HF's greedy run of the same weights with the window removed, one narrower, one wider
    (Phi3 reads config.sliding_window at every call); and the margins of the windowless run."""
    out = {}
    for name, w in (("no_window", None), ("window_5", 5), ("window_7", 7)):
        m = copy.deepcopy(model).eval()
        m.config.sliding_window = w
        r, margins = greedy_reference(m, prompt_ids, n_new=N_NEW)
        out[name] = record(r)
        if w is None:
            nowin_margins = margins
    return out, nowin_margins


def phi4_ablations(model, spec, seed, vocab_size, ids, prompt_ids):
    out = {}
    for name, rope in PHI4_ABLATIONS.items():
        m = build_model(spec["cfg"], seed, vocab_size, ids, rope_parameters=rope)
        m.load_state_dict(model.state_dict())
        r, _ = greedy_reference(m.eval(), prompt_ids, n_new=N_NEW)
        out[name] = record(r)
    return out


def detectable(abl, f32, logprob_ok=()) -> bool:
    for k, a in abl.items():
        if a["tokens"] == toks(f32) and not (
                k in logprob_ok and max(abs(x - s["logprob"]) for x, s in zip(a["logprobs"], f32["steps"])) >= 0.01):
            return False
    return True


@torch.no_grad()
def recompute_logprobs(model, seq):
    return torch.log_softmax(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0].float(), -1)


def phi4_runs(model, prompt_ids, bad):
    """The extra incremental references ("short", "crossing"), or None when one is unusable."""
    runs = {}
    for name, (n_prompt, n_new) in RUNS.items():
        p = prompt_ids[:n_prompt]
        r, margins = greedy_reference(model, p, n_new=n_new)
        if not acceptable(r, margins, bad, min_distinct=min(6, n_new // 2)):
            return None
        runs[name] = {"prompt_ids": p, "n_new": n_new, "steps": r["steps"]}
    return runs


def check_phi4_runs(model, runs, orig: int):
    assert check_recompute(model, runs["short"]["prompt_ids"], runs["short"]["steps"]) < 1e-4
    c = runs["crossing"]
    seq = c["prompt_ids"] + toks(c)
    n_short = orig - len(c["prompt_ids"]) + 1  # steps whose logits come from positions < orig
    lps = recompute_logprobs(model, seq[:orig])  # orig positions: short factors, like the cached steps
    assert all(int(torch.argmax(lps[len(c["prompt_ids"]) - 1 + i])) == s["token"] and
               abs(float(lps[len(c["prompt_ids"]) - 1 + i][s["token"]]) - s["logprob"]) < 1e-4
               for i, s in enumerate(c["steps"][:n_short]))
    lps = recompute_logprobs(model, seq)  # the whole sequence past orig: long factors everywhere
    diff = max(abs(float(lps[len(c["prompt_ids"]) - 1 + i][s["token"]]) - s["logprob"]) for i, s in enumerate(c["steps"]))
    assert diff > 1e-3, diff
    c["recompute_differs"] = True
    # HF's generate() drops the cache at the switch (Phi3ForCausalLM.prepare_inputs_for_generation)
    # and recomputes the sequence with the long factors: record what it gives
    g = model.generate(torch.tensor([c["prompt_ids"]]), max_new_tokens=c["n_new"], do_sample=False,
                       min_new_tokens=c["n_new"], return_dict_in_generate=True, output_logits=True)
    lps = [torch.log_softmax(x[0].float(), -1) for x in g.logits]
    c["hf_generate"] = {"tokens": g.sequences[0, len(c["prompt_ids"]):].tolist(),
                        "logprobs": [as_f32(lp.max()) for lp in lps]}
    assert c["hf_generate"]["tokens"] == [int(lp.argmax()) for lp in lps]
    first = next((i for i, (a, b) in enumerate(zip(c["hf_generate"]["tokens"], toks(c))) if a != b), None)
    print(f"  crossing: the first {n_short} steps equal a {orig}-position recompute; a full recompute differs "
          f"by up to {diff:.3f} in logprob; HF's generate() differs from token {first} on")


def write_gguf(path: Path, model, name: str, tok_json: dict, ids: dict, chat_template: str):
    """model-f32.gguf as convert_hf_to_gguf.py's Phi3MiniModel writes it (tokenizer: new_gguf_writer)."""
    c = model.config
    rp = c.rope_parameters
    prf = rp.get("partial_rotary_factor", 1.0)
    w = new_gguf_writer(path, "phi3", GGMLQuantizationType.F32, GGUF_NAMES[name], n_layer=c.num_hidden_layers,
                        n_ctx=c.max_position_embeddings, n_embd=c.hidden_size, n_ff=c.intermediate_size,
                        n_head=c.num_attention_heads, n_kv=c.num_key_value_heads,
                        head_dim=c.hidden_size // c.num_attention_heads, rope_theta=rp["rope_theta"],
                        rms_eps=c.rms_norm_eps, vocab_size=c.vocab_size, tok_json=tok_json,
                        eos_id=ids["<|im_end|>"], pad_id=ids["<|endoftext|>"], bos_id=None, chat_template=chat_template)
    orig = c.original_max_position_embeddings
    w.add_rope_scaling_orig_ctx_len(orig)
    w.add_rope_dimension_count(int(prf * c.hidden_size) // c.num_attention_heads)
    w.add_sliding_window(c.sliding_window or 0)
    tensors = []
    if rp.get("long_factor"):
        scale = c.max_position_embeddings / orig
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0)
        tensors += [("rope_factors_long.weight", np.array(rp["long_factor"], np.float32)),
                    ("rope_factors_short.weight", np.array(rp["short_factor"], np.float32))]
    sd = {k: v.detach().to(torch.float32).numpy() for k, v in model.state_dict().items()}
    tensors.append(("token_embd.weight", sd["model.embed_tokens.weight"]))
    for i in range(c.num_hidden_layers):
        for g, h in (("attn_norm", "input_layernorm"), ("attn_qkv", "self_attn.qkv_proj"),
                     ("attn_output", "self_attn.o_proj"), ("ffn_norm", "post_attention_layernorm"),
                     ("ffn_up", "mlp.gate_up_proj"), ("ffn_down", "mlp.down_proj")):
            tensors.append((f"blk.{i}.{g}.weight", sd[f"model.layers.{i}.{h}.weight"]))
    tensors.append(("output_norm.weight", sd["model.norm.weight"]))
    if not c.tie_word_embeddings:
        tensors.append(("output.weight", sd["lm_head.weight"]))
    for gname, arr in tensors:
        data, raw_dtype = gguf_payload(arr, GGMLQuantizationType.F32)
        w.add_tensor(gname, data, raw_shape=None, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return [g for g, _ in tensors]


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    np.random.seed(0)

    tok = build_tokenizer()
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS + ADDED_TOKENS}
    bad = list(ids.values())
    prompt_ids = tok.encode(PROMPT_TEXT).ids
    assert len(prompt_ids) == PROMPT_LEN, len(prompt_ids)
    tokenizer_config = json.loads((OUT / "llama-tiny" / "tokenizer_config.json").read_text())

    for name, spec in SPECS.items():
        phi4 = name == "phi4-mini-tiny"
        for seed in range(spec["seed"], spec["seed"] + MAX_SEED_TRIES):
            model = build_model(spec["cfg"], seed, vocab_size, ids)
            f32, m32 = greedy_reference(model, prompt_ids, full_prefill=True)
            ok = acceptable(f32, m32, bad)
            if ok and phi4:
                runs = phi4_runs(model, prompt_ids, bad)
                ok = runs is not None
                if ok:
                    abl = phi4_ablations(model, spec, seed, vocab_size, ids, prompt_ids)
                    ok = detectable(abl, f32, logprob_ok=("attention_factor_1",))
            elif ok:
                abl, nowin_margins = phi3_ablations(model, prompt_ids)
                # llama.cpp decodes the windowless model: its run must be as robust as the reference
                ok = detectable(abl, f32) and acceptable({"steps": [{"token": t} for t in abl["no_window"]["tokens"]]},
                                                         nowin_margins, bad)
            if ok:
                break
        else:
            raise SystemExit(f"{name}: no acceptable seed found")
        c = model.config
        rot = model.model.rotary_emb
        print(f"{name}: seed={seed} tokens={toks(f32)} min margin={min(m32):.4f} "
              f"rope {c.rope_parameters['rope_type']} inv_freq {len(rot.inv_freq)} attention_scaling {rot.attention_scaling:.6f}")
        if phi4:
            assert abs(rot.attention_scaling - math.sqrt(1 + math.log(4) / math.log(16))) < 1e-12
            check_phi4_runs(model, runs, c.original_max_position_embeddings)
        for k, a in abl.items():
            d = [i for i, (x, y) in enumerate(zip(a["tokens"], toks(f32))) if x != y]
            lp = max(abs(x - s["logprob"]) for x, s in zip(a["logprobs"], f32["steps"]))
            print(f"  ablation {k}: {len(d)}/{N_NEW} tokens differ" + (f" (first at {d[0]})" if d else "")
                  + f", max |dlogprob| {lp:.3f}")

        ref = reference_runs(model, tok, name, seed, prompt_ids, f32)
        if phi4:
            ref["runs"] = runs
        ref["ablations"] = {"prompt": "prompt_ids", "n_new": N_NEW, "f32": abl}
        out = OUT / name
        save_model_dir(out, model, tok, tokenizer_config, ids, ref)

        cfg = json.loads((out / "config.json").read_text())
        print(f"  config.json: {json.dumps(cfg)}")
        assert cfg["model_type"] == "phi3" and cfg["sliding_window"] == spec["cfg"]["sliding_window"], cfg
        assert cfg["original_max_position_embeddings"] == spec["cfg"]["original_max_position_embeddings"]
        assert cfg["tie_word_embeddings"] == spec["cfg"]["tie_word_embeddings"]
        if phi4:
            rp = cfg["rope_parameters"]
            assert rp["partial_rotary_factor"] == 0.75 and rp["rope_type"] == "longrope", rp
            assert rp["short_factor"] == FACTORS["short_factor"] and rp["long_factor"] == FACTORS["long_factor"], rp
            assert rp["original_max_position_embeddings"] == 16, rp
        m = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
        r, _ = greedy_reference(m, prompt_ids)
        assert toks(r) == toks(f32)
        assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(r["steps"], f32["steps"])) < 1e-5
        if phi4:
            for k, run in runs.items():
                r, _ = greedy_reference(m, run["prompt_ids"], n_new=run["n_new"])
                assert toks(r) == toks(run), k
                assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(r["steps"], run["steps"])) < 1e-5, k
        print("  reload OK")

        gguf_path = out / "model-f32.gguf"
        names = write_gguf(gguf_path, model, name, json.loads(tok.to_str()), ids, tokenizer_config["chat_template"])
        print(f"  model-f32.gguf: {len(names)} tensors, {', '.join(n for n in names if not n.startswith('blk.'))}, blk.N.*")
        ll = llamacpp_greedy(gguf_path, prompt_ids, N_NEW)
        if phi4:
            want = f32["steps"]
        else:  # llama.cpp runs Phi-3 without its window: compare with HF's windowless run
            ll["reference"] = "ablations.f32.no_window"
            want = [{"token": t, "logprob": lp} for t, lp in zip(abl["no_window"]["tokens"], abl["no_window"]["logprobs"])]
            agree = next((i for i, (a, b) in enumerate(zip(ll["tokens"], toks(f32))) if a != b), N_NEW)
            print(f"  llama.cpp vs HF with the window: the first {agree} tokens agree")
        assert ll["tokens"] == [s["token"] for s in want], f"llama.cpp decodes the GGUF otherwise: {ll['tokens']} vs HF {want}"
        worst = max(abs(a - s["logprob"]) for a, s in zip(ll["logprobs"], want))
        print(f"  llama.cpp on model-f32.gguf: HF's {'' if phi4 else 'no_window '}{N_NEW} tokens, "
              f"max |dlogprob| {worst:.2e}")
        ref["llamacpp"] = ll
        dump_json(out / "reference.json", ref, compact_lists=True)

        if not phi4:
            write_family_experts(out, name, prompt_ids[:EXPERT_PROMPT_LEN], targets=PHI3_TARGETS,
                                 feedforward=PHI3_FEEDFORWARD)
            keys = describe_keys(out / "experts" / "ia3")
            p = "base_model.model.model.layers.0."
            assert keys[p + "self_attn.qkv_proj.ia3_l"] == [128, 1] and keys[p + "self_attn.o_proj.ia3_l"] == [64, 1]
            assert keys[p + "mlp.gate_up_proj.ia3_l"] == [1, 64] and keys[p + "mlp.down_proj.ia3_l"] == [1, 96], keys
            for kind in ("lora", "dora"):
                print(f"  {kind}: " + ", ".join(f"{k.removeprefix(p)} {v}" for k, v in sorted(describe_keys(out / "experts" / kind).items())
                                                 if k.startswith(p)))
        total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        print(f"  {out.relative_to(ROOT)} {total / 1e3:.0f} KB")


if __name__ == "__main__":
    main()
