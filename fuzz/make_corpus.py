#!/usr/bin/env python3
"""Writes the fuzz seed corpus, fuzz/corpus/<target>/, from the repository's test fixtures plus a
few synthetic files (tiny GGUF and safetensors files written here by hand, Python stdlib only).

    python3 fuzz/make_corpus.py        # from the repository root (or anywhere)

The output is deterministic. Inputs that once crashed a target are kept next to the seeds as
`regress-*` files (written here when they can be, copied from fuzz/artifacts otherwise); this
script leaves files it did not write alone.
"""

import json
import struct
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
ROOT = FUZZ.parent
FIXTURES = ROOT / "__test__" / "fixtures"
CORPUS = FUZZ / "corpus"
MODELS = ["qwen3-tiny", "qwen2-tiny", "llama-tiny", "qwen3-untied-mqa"]


def put(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / name).write_bytes(data)


# ------------------------------------------------------------------------------------ GGUF

GGUF_U8, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY = range(10)
GGUF_U64, GGUF_I64, GGUF_F64 = 10, 11, 12
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q5_0, GGML_Q8_0 = 0, 1, 2, 3, 6, 8
# (block size, bytes per block)
GGML_BLOCK = {GGML_F32: (1, 4), GGML_F16: (1, 2), GGML_Q4_0: (32, 18), GGML_Q4_1: (32, 20), GGML_Q5_0: (32, 22), GGML_Q8_0: (32, 34)}


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(ty, v):
    if ty == GGUF_STRING:
        return gguf_str(v)
    if ty == GGUF_ARRAY:
        elem_ty, items = v
        return struct.pack("<IQ", elem_ty, len(items)) + b"".join(gguf_value(elem_ty, x) for x in items)
    fmt = {GGUF_U8: "<B", GGUF_I8: "<b", GGUF_U16: "<H", GGUF_I16: "<h", GGUF_U32: "<I", GGUF_I32: "<i",
           GGUF_F32: "<f", GGUF_BOOL: "<?", GGUF_U64: "<Q", GGUF_I64: "<q", GGUF_F64: "<d"}[ty]
    return struct.pack(fmt, v)


def gguf(metadata, tensors, alignment=32):
    """metadata: [(key, type, value)]; tensors: [(name, dims (ggml order), ggml type)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, ty, v in metadata:
        out += gguf_str(key) + struct.pack("<I", ty) + gguf_value(ty, v)
    offset, datas = 0, []
    for name, dims, ty in tensors:
        n = 1
        for d in dims:
            n *= d
        block, size = GGML_BLOCK[ty]
        nbytes = n // block * size
        out += gguf_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ty, offset)
        # Small deterministic values; f16 scales of quantized blocks stay finite.
        datas.append(bytes((i * 7 + 3) % 61 for i in range(nbytes)))
        offset += (nbytes + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    for d in datas:
        out += d + b"\0" * (-len(d) % alignment)
    return out


def byte_level_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def arch_metadata(arch, layers=2, hidden=64, heads=4, kv_heads=2, ff=128, ctx=256):
    return [
        ("general.architecture", GGUF_STRING, arch),
        ("general.name", GGUF_STRING, f"tiny-{arch}"),
        (f"{arch}.block_count", GGUF_U32, layers),
        (f"{arch}.context_length", GGUF_U32, ctx),
        (f"{arch}.embedding_length", GGUF_U32, hidden),
        (f"{arch}.feed_forward_length", GGUF_U32, ff),
        (f"{arch}.attention.head_count", GGUF_U32, heads),
        (f"{arch}.attention.head_count_kv", GGUF_U32, kv_heads),
        (f"{arch}.attention.layer_norm_rms_epsilon", GGUF_F32, 1e-6),
        (f"{arch}.rope.freq_base", GGUF_F32, 10000.0),
    ]


def byte_level_tokenizer(pre):
    tokens = byte_level_alphabet()
    merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "1 2"]
    tokens += [m.replace(" ", "") for m in merges] + ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"]
    types = [1] * (256 + len(merges)) + [3, 3, 3, 4]
    n = len(tokens)
    return [
        ("tokenizer.ggml.model", GGUF_STRING, "gpt2"),
        ("tokenizer.ggml.pre", GGUF_STRING, pre),
        ("tokenizer.ggml.tokens", GGUF_ARRAY, (GGUF_STRING, tokens)),
        ("tokenizer.ggml.token_type", GGUF_ARRAY, (GGUF_I32, types)),
        ("tokenizer.ggml.merges", GGUF_ARRAY, (GGUF_STRING, merges)),
        ("tokenizer.ggml.bos_token_id", GGUF_U32, n - 3),
        ("tokenizer.ggml.eos_token_id", GGUF_U32, n - 2),
        ("tokenizer.ggml.add_bos_token", GGUF_BOOL, True),
        ("tokenizer.chat_template", GGUF_STRING, CHATML),
    ]


def spm_tokenizer():
    tokens, types = ["<unk>", "<s>", "</s>"], [2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "ll", "▁he", "llo", "▁hello", "or", "▁w", "ld", "▁wor", "▁world"]
    tokens += pieces
    types += [1] * len(pieces)
    return [
        ("tokenizer.ggml.model", GGUF_STRING, "llama"),
        ("tokenizer.ggml.tokens", GGUF_ARRAY, (GGUF_STRING, tokens)),
        ("tokenizer.ggml.token_type", GGUF_ARRAY, (GGUF_I32, types)),
        ("tokenizer.ggml.scores", GGUF_ARRAY, (GGUF_F32, [-float(i) for i in range(len(tokens))])),
        ("tokenizer.ggml.bos_token_id", GGUF_U32, 1),
        ("tokenizer.ggml.eos_token_id", GGUF_U32, 2),
        ("tokenizer.ggml.unknown_token_id", GGUF_U32, 0),
        ("tokenizer.ggml.add_space_prefix", GGUF_BOOL, True),
    ]


def gguf_seeds():
    put("gguf", "llama-gpt2-q8_0.gguf", gguf(
        arch_metadata("llama") + byte_level_tokenizer("llama-bpe"),
        [("token_embd.weight", [64, 8], GGML_Q8_0), ("output_norm.weight", [64], GGML_F32),
         ("blk.0.attn_q.weight", [64, 2], GGML_Q8_0)]))
    put("gguf", "qwen3-gpt2-f16.gguf", gguf(
        arch_metadata("qwen3") + [("qwen3.attention.key_length", GGUF_U32, 16)] + byte_level_tokenizer("qwen2"),
        [("blk.0.attn_q_norm.weight", [16], GGML_F32), ("blk.0.attn_k.weight", [64, 2], GGML_F16),
         ("blk.0.ffn_up.weight", [64, 2], GGML_Q4_1)]))
    put("gguf", "llama-spm-q5_0.gguf", gguf(
        arch_metadata("llama") + spm_tokenizer(),
        [("blk.0.ffn_down.weight", [128, 2], GGML_Q5_0), ("blk.0.ffn_gate.weight", [64, 2], GGML_Q4_0)]))
    put("gguf", "qwen2-no-tokenizer.gguf", gguf(arch_metadata("qwen2") + [("qwen2.vocab_size", GGUF_U32, 400)], []))
    # The header of a real fixture (metadata and tensor infos, no tensor data).
    src = (FIXTURES / "qwen3-tiny" / "model-q8_0.gguf").read_bytes()
    put("gguf", "qwen3-tiny-header.gguf", src[:gguf_header_len(src)])


def gguf_header_len(b):
    """Bytes up to the end of the tensor infos of a GGUF v3 file."""
    pos = 4 + 4
    n_tensors, n_kv = struct.unpack_from("<QQ", b, pos)
    pos += 16

    def skip_value(ty, pos):
        if ty == GGUF_STRING:
            (n,) = struct.unpack_from("<Q", b, pos)
            return pos + 8 + n
        if ty == GGUF_ARRAY:
            elem, n = struct.unpack_from("<IQ", b, pos)
            pos += 12
            for _ in range(n):
                pos = skip_value(elem, pos)
            return pos
        return pos + {GGUF_U8: 1, GGUF_I8: 1, GGUF_BOOL: 1, GGUF_U16: 2, GGUF_I16: 2, GGUF_U32: 4, GGUF_I32: 4,
                      GGUF_F32: 4, GGUF_U64: 8, GGUF_I64: 8, GGUF_F64: 8}[ty]

    for _ in range(n_kv):
        pos = skip_value(GGUF_STRING, pos)
        (ty,) = struct.unpack_from("<I", b, pos)
        pos = skip_value(ty, pos + 4)
    for _ in range(n_tensors):
        pos = skip_value(GGUF_STRING, pos)
        (n_dims,) = struct.unpack_from("<I", b, pos)
        pos += 4 + 8 * n_dims + 4 + 8
    return pos


# ----------------------------------------------------------------------------- safetensors


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, raw bytes)]."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def floats(fmt, values):
    return b"".join(struct.pack(fmt, v) for v in values)


def safetensors_seeds():
    for name in ["prompt", "ia3_qwen2", "ia3"]:
        put("safetensors_header", f"{name}.safetensors", (FIXTURES / "adapters" / name / "adapter_model.safetensors").read_bytes())
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    put("safetensors_header", "lora-f16-bf16.safetensors", safetensors(
        [(f"{key}.lora_A.weight", "F16", [2, 4], floats("<e", [0.5, -1.0, 2.0, 0.25] * 2)),
         (f"{key}.lora_B.weight", "BF16", [4, 2], bytes([0x80, 0x3F, 0x00, 0x40] * 4))],
        {"format": "pt"}))
    put("safetensors_header", "f64-i32-u8.safetensors", safetensors(
        [("model.norm.weight", "F64", [3], floats("<d", [1.0, 2.0, 3.0])),
         ("ids", "I32", [2, 2], floats("<i", [1, -2, 3, -4])),
         ("mask", "U8", [4], bytes([0, 1, 2, 255])),
         ("empty", "F32", [0, 5], b"")]))
    put("safetensors_header", "non-finite.safetensors", safetensors(
        [(f"{key}.lora_A.weight", "F32", [1, 2], floats("<f", [float("inf"), 1.0]))]))


# ---------------------------------------------------------------------- JSON and templates


def json_seeds():
    for m in MODELS:
        put("config_json", f"{m}.json", (FIXTURES / m / "config.json").read_bytes())
    put("config_json", "transformers5-rope-parameters.json", json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 400, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "dtype": "bfloat16",
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "eos_token_id": [1, 2]}))
    for d in sorted((FIXTURES / "adapters").iterdir()):
        for f in ["adapter_config.json", "manifest.json"]:
            if (d / f).is_file():
                put("peft_config", f"{d.name}-{f}", (d / f).read_bytes())
    put("peft_config", "manifest-base-object.json", json.dumps({
        "name": "sql", "version": "1.0", "load_order": -3, "routing": {"keywords": ["sql"], "exclude_keywords": [], "priority": 2.5},
        "base_model": {"architecture": "qwen3", "hidden_size": 1024, "num_layers": 28}}))
    put("peft_config", "lokr-patterns.json", json.dumps({
        "peft_type": "LOKR", "r": 4, "alpha": 8, "target_modules": "model\\.layers\\.[0-9]+\\.mlp\\..*_proj",
        "exclude_modules": ["down_proj"], "layers_to_transform": 1, "rank_pattern": {"up_proj": 2},
        "auto_mapping": {"base_model_class": "Qwen3ForCausalLM"}}))


def ref_chain(n, wrap=lambda r: r):
    defs = {f"a{i}": (wrap({"$ref": f"#/$defs/a{i + 1}"}) if i + 1 < n else {"type": "string"}) for i in range(n)}
    return {"$defs": defs, "$ref": "#/$defs/a0"}


def rule_chain(n):
    return "start: r0\n" + "".join(f"r{i}: {f'r{i + 1}' if i + 1 < n else chr(34) + 'x' + chr(34)}\n" for i in range(n))


def structured_seeds():
    """Formats that make llguidance's compilers recurse (a $ref chain of 650 links and a Lark
    rule chain of 800 rules overflowed a thread's stack): within the depth bound (1000 levels),
    past it, and through the other ways in (tool parameters, %json inside Lark)."""
    compact = lambda v: json.dumps(v, separators=(",", ":"))
    put("structured_format", "deep-ref-chain-400", b"\x00" + compact(ref_chain(400)).encode())
    put("structured_format", "deep-ref-chain-anyof-150", b"\x00" + compact(ref_chain(150, lambda r: {"anyOf": [r, {"type": "null"}]})).encode())
    put("structured_format", "deep-tool-params-ref-chain-400", b"\x03" + compact(ref_chain(400)).encode())
    put("structured_format", "deep-lark-rule-chain-990", b"\x02" + rule_chain(990).encode())
    put("structured_format", "deep-lark-rule-chain-1500", b"\x02" + rule_chain(1500).encode())
    put("structured_format", "deep-lark-json-ref-chain-300", b"\x02" + ("start: %json " + compact(ref_chain(300)) + "\n").encode())


def template_seed(name, flags, source, messages=None):
    data = bytes([flags]) + source.encode()
    if messages is not None:
        data += b"\0" + json.dumps(messages, ensure_ascii=False).encode()
    put("chat_template", name, data)


def template_seeds():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <b>&</b> 日本"},
            {"role": "assistant", "content": "<think>\nplan\n</think>\n\nHello!"}, {"role": "user", "content": "bye"}]
    qwen3 = json.loads((FIXTURES / "qwen3-tiny" / "tokenizer_config.json").read_text())["chat_template"]
    template_seed("qwen3", 0b100001, qwen3, chat)
    template_seed("qwen3-no-think", 0b000011, qwen3, chat[:2])
    template_seed("chatml", 0b011001, CHATML, chat)
    template_seed("llama2-raise", 0b011000,
                  "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% endif %}"
                  "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                  "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
                  "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + message['content'].strip() + ' [/INST]' }}"
                  "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'].strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
                  chat[1:3])
    template_seed("tojson-strftime", 0b000001,
                  "{{ strftime_now('%d %b %Y') }}{% for m in messages %}{{ m | tojson(indent=2, sort_keys=true) }}"
                  "{{ m.content.split(' ') | tojson(separators=(',', ':')) }}{% generation %}{{ m.role.upper() }}{% endgeneration %}"
                  "{% endfor %}{{ {'a': [1, 2.5, none, true]} | tojson }}")
    template_seed("loops-macros", 0b000000,
                  "{% macro f(x) %}{{ x * 2 }}{% endmacro %}{% for i in range(10) %}{% if i is even %}{% continue %}{% endif %}"
                  "{{ f(i) }}{% if i > 6 %}{% break %}{% endif %}{% endfor %}{{ messages | map(attribute='role') | join(',') }}"
                  "{{ namespace(x=1).x }}{{ 'abc'[::-1] }}{{ messages[-1].content[:3] }}", [])


def regress_seeds():
    """Inputs that once crashed or stalled a target (see the unit tests named in each comment)."""
    # candle's header reader divides by general.alignment (loader::read_gguf_header catches it).
    put("gguf", "regress-alignment-zero.gguf", gguf(arch_metadata("llama") + [("general.alignment", GGUF_U32, 0)], []))
    # One 50 KB SentencePiece piece: deriving its merges was quadratic in its length
    # (tokenizer::gguf a_long_sentencepiece_piece_does_not_stall_the_load).
    md = arch_metadata("llama") + spm_tokenizer()
    for i, (k, ty, v) in enumerate(md):
        if k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            extra = {"tokenizer.ggml.tokens": "▁" + "a" * 50000, "tokenizer.ggml.token_type": 1, "tokenizer.ggml.scores": 0.0}[k]
            md[i] = (k, ty, (v[0], v[1] + [extra]))
    put("gguf", "regress-spm-long-piece.gguf", gguf(md, []))
    # tojson(indent=3e9) allocated the indent string (tokenizer::template tojson_indent_is_bounded).
    template_seed("regress-tojson-indent", 0, "{{ [1] | tojson(indent=3000000000) }}")


if __name__ == "__main__":
    gguf_seeds()
    regress_seeds()
    safetensors_seeds()
    json_seeds()
    template_seeds()
    structured_seeds()
    total = 0
    for t in sorted(CORPUS.iterdir()):
        files = list(t.iterdir())
        size = sum(f.stat().st_size for f in files)
        total += size
        print(f"{t.name}: {len(files)} files, {size} bytes")
    print(f"corpus: {total} bytes")
