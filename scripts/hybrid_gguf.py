"""GGUF side of scripts/gen_hybrid_fixtures.py: the model-f32.gguf of qwen35-tiny,
qwen35-llamacpp-tiny and lfm2-tiny as llama.cpp's convert_hf_to_gguf.py writes a `qwen35`
(Qwen3_5TextModel, --no-mtp) and an `lfm2` (LFM2Model) file, and an independent float64 numpy
forward over a GGUF with llama.cpp's semantics.

qwen35 (conversion/qwen.py: Qwen3NextModel + _LinearAttentionVReorderBase):
  * every `*norm.weight` except `linear_attn.norm.weight` is stored as w + 1 (Qwen3.5's norms
    apply 1 + w); `linear_attn.norm` (the gated norm, plain w) -> `ssm_norm` unchanged;
  * A_log -> `ssm_a` = -exp(A_log) (no .weight suffix); dt_bias -> `ssm_dt.bias`;
    conv1d.weight [C, 1, K] -> `ssm_conv1d.weight` squeezed to [C, K];
  * in_proj_qkv -> `attn_qkv`, in_proj_z -> `attn_gate`, in_proj_b -> `ssm_beta`,
    in_proj_a -> `ssm_alpha`, out_proj -> `ssm_out`;
  * with linear_num_value_heads > linear_num_key_heads the value heads are reordered from HF's
    grouped order (value head g*r + a belongs to key head g, r = n_v / n_k) to ggml's tiled order
    (GGUF head a*n_k + g): the V rows of attn_qkv and the V channels of ssm_conv1d, the rows of
    attn_gate / ssm_beta / ssm_alpha, ssm_a, ssm_dt and the columns of ssm_out;
  * the full-attention layer's q_proj (per head: head_dim query rows, then head_dim gate rows)
    -> `attn_q` unchanged; o_proj -> `attn_output`; post_attention_layernorm -> `post_attention_norm`.
lfm2 (conversion/lfm2.py): conv.conv.weight [C, 1, L] -> `shortconv.conv.weight` [C, L];
  conv.in_proj / conv.out_proj -> `shortconv.in_proj` / `.out_proj`; operator_norm -> attn_norm;
  feed_forward.w1 / w3 / w2 -> ffn_gate / ffn_up / ffn_down; self_attn.out_proj -> attn_output;
  q_layernorm / k_layernorm -> attn_q_norm / attn_k_norm; model.embedding_norm (the final
  norm) -> `token_embd_norm`; no output tensor (tied); norms stored as they are (plain w).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
import gguf

from gen_fixtures import gguf_payload, new_gguf_writer


# --------------------------------------------------------------------------------------
# HF -> GGUF tensors
# --------------------------------------------------------------------------------------

def v_tiled(t: torch.Tensor, dim: int, n_k: int, r: int, d: int) -> torch.Tensor:
    """The converter's _reorder_v_heads: blocks of `d` along `dim` from grouped order
    (index g*r + a) to tiled order (index a*n_k + g)."""
    shape = list(t.shape)
    dim %= len(shape)
    t = t.reshape(*shape[:dim], n_k, r, d, *shape[dim + 1:])
    return t.transpose(dim, dim + 1).contiguous().reshape(shape)


def v_grouped(t: torch.Tensor, dim: int, n_k: int, r: int, d: int) -> torch.Tensor:
    """Inverse of v_tiled."""
    shape = list(t.shape)
    dim %= len(shape)
    t = t.reshape(*shape[:dim], r, n_k, d, *shape[dim + 1:])
    return t.transpose(dim, dim + 1).contiguous().reshape(shape)


def qwen35_layer_map(c, lt: str):
    """[(gguf suffix, hf suffix, transform, how)] of one qwen35 layer of type `lt`, in the
    converter's semantics (`c`: the HF config)."""
    nk, nv, dk, dv = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                      c.linear_value_head_dim)
    r, kd = nv // nk, nk * dk
    tv = lambda t, dim, d: v_tiled(t, dim, nk, r, d) if r > 1 else t  # noqa: E731
    m = [("attn_norm.weight", "input_layernorm.weight", lambda w: w + 1, "w + 1")]
    if lt == "linear_attention":
        m += [
            ("attn_qkv.weight", "linear_attn.in_proj_qkv.weight",
             lambda w: torch.cat([w[:2 * kd], tv(w[2 * kd:], 0, dv)]), "V rows tiled"),
            ("attn_gate.weight", "linear_attn.in_proj_z.weight", lambda w: tv(w, 0, dv), "rows tiled"),
            ("ssm_conv1d.weight", "linear_attn.conv1d.weight",
             lambda w: torch.cat([w.squeeze()[:2 * kd], tv(w.squeeze()[2 * kd:], 0, dv)]),
             "squeeze, V channels tiled"),
            ("ssm_dt.bias", "linear_attn.dt_bias", lambda w: tv(w[:, None], 0, 1)[:, 0], "tiled"),
            ("ssm_a", "linear_attn.A_log", lambda w: -torch.exp(tv(w[:, None], 0, 1)[:, 0]), "-exp(w), tiled"),
            ("ssm_beta.weight", "linear_attn.in_proj_b.weight", lambda w: tv(w, 0, 1), "rows tiled"),
            ("ssm_alpha.weight", "linear_attn.in_proj_a.weight", lambda w: tv(w, 0, 1), "rows tiled"),
            ("ssm_norm.weight", "linear_attn.norm.weight", lambda w: w, "="),
            ("ssm_out.weight", "linear_attn.out_proj.weight", lambda w: tv(w, 1, dv), "columns tiled"),
        ]
    else:
        m += [("attn_q.weight", "self_attn.q_proj.weight", lambda w: w, "="),
              ("attn_k.weight", "self_attn.k_proj.weight", lambda w: w, "="),
              ("attn_v.weight", "self_attn.v_proj.weight", lambda w: w, "="),
              ("attn_output.weight", "self_attn.o_proj.weight", lambda w: w, "="),
              ("attn_q_norm.weight", "self_attn.q_norm.weight", lambda w: w + 1, "w + 1"),
              ("attn_k_norm.weight", "self_attn.k_norm.weight", lambda w: w + 1, "w + 1")]
    m += [("post_attention_norm.weight", "post_attention_layernorm.weight", lambda w: w + 1, "w + 1"),
          ("ffn_gate.weight", "mlp.gate_proj.weight", lambda w: w, "="),
          ("ffn_up.weight", "mlp.up_proj.weight", lambda w: w, "="),
          ("ffn_down.weight", "mlp.down_proj.weight", lambda w: w, "=")]
    return m


def qwen35_plan(c):
    """[(gguf name, hf name, transform, how)] of the whole model, in GGUF file order."""
    ident = lambda w: w  # noqa: E731
    out = [("token_embd.weight", "model.embed_tokens.weight", ident, "=")]
    for i, lt in enumerate(c.layer_types):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out += [(b + g, p + h, f, how) for g, h, f, how in qwen35_layer_map(c, lt)]
    out.append(("output_norm.weight", "model.norm.weight", lambda w: w + 1, "w + 1"))
    if not c.tie_word_embeddings:
        out.append(("output.weight", "lm_head.weight", ident, "="))
    return out


def qwen35_tensors(model):
    """(gguf name, float32 torch tensor, hf name, how) in the converter's semantics."""
    sd = {k: v.detach().to(torch.float32) for k, v in model.state_dict().items()}
    return [(g, f(sd[h]), h, how) for g, h, f, how in qwen35_plan(model.config)]


def qwen35_inverse(name: str, t: torch.Tensor, c) -> torch.Tensor:
    """HF tensor back from a qwen35 GGUF tensor (float32; w + 1 and -exp round within an ulp)."""
    nk, nv, dk, dv = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                      c.linear_value_head_dim)
    r, kd = nv // nk, nk * dk
    tg = lambda t, dim, d: v_grouped(t, dim, nk, r, d) if r > 1 else t  # noqa: E731
    g = name.split(".", 2)[-1] if name.startswith("blk.") else name
    if g.endswith("norm.weight") and g != "ssm_norm.weight":
        return t - 1
    if g == "attn_qkv.weight":
        return torch.cat([t[:2 * kd], tg(t[2 * kd:], 0, dv)])
    if g == "ssm_conv1d.weight":
        return torch.cat([t[:2 * kd], tg(t[2 * kd:], 0, dv)])[:, None, :]
    if g == "attn_gate.weight":
        return tg(t, 0, dv)
    if g in ("ssm_dt.bias", "ssm_a"):
        t = tg(t[:, None], 0, 1)[:, 0]
        return torch.log(-t) if g == "ssm_a" else t
    if g in ("ssm_beta.weight", "ssm_alpha.weight"):
        return tg(t, 0, 1)
    if g == "ssm_out.weight":
        return tg(t, 1, dv)
    return t


def lfm2_tensors(model):
    c = model.config
    sd = {k: v.detach().to(torch.float32) for k, v in model.state_dict().items()}
    ident = lambda w: w  # noqa: E731
    out = [("token_embd.weight", sd["model.embed_tokens.weight"], "model.embed_tokens.weight", "=")]
    for i, lt in enumerate(c.layer_types):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        m = [("attn_norm.weight", "operator_norm.weight", ident, "=")]
        if lt == "conv":
            m += [("shortconv.conv.weight", "conv.conv.weight", lambda w: w.squeeze(1), "squeeze(1)"),
                  ("shortconv.in_proj.weight", "conv.in_proj.weight", ident, "="),
                  ("shortconv.out_proj.weight", "conv.out_proj.weight", ident, "=")]
        else:
            m += [("attn_q.weight", "self_attn.q_proj.weight", ident, "="),
                  ("attn_k.weight", "self_attn.k_proj.weight", ident, "="),
                  ("attn_v.weight", "self_attn.v_proj.weight", ident, "="),
                  ("attn_output.weight", "self_attn.out_proj.weight", ident, "="),
                  ("attn_q_norm.weight", "self_attn.q_layernorm.weight", ident, "="),
                  ("attn_k_norm.weight", "self_attn.k_layernorm.weight", ident, "=")]
        m += [("ffn_norm.weight", "ffn_norm.weight", ident, "="),
              ("ffn_gate.weight", "feed_forward.w1.weight", ident, "="),
              ("ffn_up.weight", "feed_forward.w3.weight", ident, "="),
              ("ffn_down.weight", "feed_forward.w2.weight", ident, "=")]
        out += [(b + g, f(sd[p + h]), p + h, how) for g, h, f, how in m]
    out.append(("token_embd_norm.weight", sd["model.embedding_norm.weight"], "model.embedding_norm.weight", "="))
    assert c.tie_word_embeddings
    return out


def lfm2_ffn_width(c) -> int:
    """Lfm2MLP's (and the converter's) real feed-forward width."""
    ff = c.intermediate_size
    if c.block_auto_adjust_ff_dim:
        ff = int(2 * ff / 3)
        if c.block_ffn_dim_multiplier is not None:
            ff = int(c.block_ffn_dim_multiplier * ff)
        ff = c.block_multiple_of * ((ff + c.block_multiple_of - 1) // c.block_multiple_of)
    return ff


def gguf_tensors(arch: str, model):
    return qwen35_tensors(model) if arch == "qwen35" else lfm2_tensors(model)


def gguf_writer(path: Path, arch: str, qtype: GGMLQuantizationType, name: str, c, tok_json: dict,
                ids: dict, chat_template: str) -> gguf.GGUFWriter:
    """A GGUFWriter with the metadata keys the converter writes (the caller adds the tensors):
    for qwen35 its ssm.* keys, attention.recurrent_layers, full_attention_interval, the partial
    rope dimension count and the M-RoPE sections (rope_sections), no vocab_size; for lfm2 a per-layer
    head_count_kv (0 on conv layers), the real ffn width, shortconv.l_cache, vocab_size and no
    key/value_length."""
    q35 = arch == "qwen35"
    w = new_gguf_writer(path, arch, qtype, name, n_layer=c.num_hidden_layers,
                        n_ctx=c.max_position_embeddings, n_embd=c.hidden_size,
                        n_ff=c.intermediate_size if q35 else lfm2_ffn_width(c), n_head=c.num_attention_heads,
                        n_kv=c.num_key_value_heads if q35 else [0 if t == "conv" else c.num_key_value_heads
                                                                 for t in c.layer_types],
                        head_dim=c.head_dim if q35 else c.hidden_size // c.num_attention_heads,
                        rope_theta=c.rope_parameters["rope_theta"], rms_eps=c.rms_norm_eps if q35 else c.norm_eps,
                        vocab_size=c.vocab_size, tok_json=tok_json, eos_id=ids["<|im_end|>"],
                        pad_id=ids["<|endoftext|>"], bos_id=None, chat_template=chat_template)
    drop = [gguf.Keys.LLM.VOCAB_SIZE] if q35 else [gguf.Keys.Attention.KEY_LENGTH, gguf.Keys.Attention.VALUE_LENGTH]
    for k in drop:
        del w.kv_data[0][k.format(arch=arch)]
    if qtype == GGMLQuantizationType.F32:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)  # the converter writes it for F32 files too
    if q35:
        w.add_ssm_conv_kernel(c.linear_conv_kernel_dim)
        w.add_ssm_state_size(c.linear_key_head_dim)
        w.add_ssm_group_count(c.linear_num_key_heads)
        w.add_ssm_time_step_rank(c.linear_num_value_heads)
        w.add_ssm_inner_size(c.linear_value_head_dim * c.linear_num_value_heads)
        w.add_array(f"{arch}.attention.recurrent_layers", [t == "linear_attention" for t in c.layer_types])
        w.add_full_attention_interval(4)  # hparams.get("full_attention_interval", 4): not in config.json
        w.add_rope_dimension_count(int(c.head_dim * c.rope_parameters["partial_rotary_factor"]))
        w.add_rope_dimension_sections(rope_sections(c))
    else:
        w.add_shortconv_l_cache(c.conv_L_cache)
    return w


def rope_sections(c) -> list[int]:
    """qwen35.rope.dimension_sections as the converter writes it: rope_parameters' `mrope_section`
    padded with zeros to 4 (TextModel.set_gguf_parameters), else _Qwen35MRopeMixin's default."""
    sec = c.rope_parameters.get("mrope_section")
    return [11, 11, 10, 0] if sec is None else (list(sec) + [0] * 4)[:4]


def write_gguf(path: Path, arch: str, name: str, model, tok_json: dict, ids: dict, chat_template: str):
    """model-f32.gguf with the metadata of gguf_writer."""
    w = gguf_writer(path, arch, GGMLQuantizationType.F32, name, model.config, tok_json, ids, chat_template)
    arrays = [(g, np.ascontiguousarray(t.numpy(), dtype=np.float32)) for g, t, _h, _ in gguf_tensors(arch, model)]
    for g, arr in arrays:
        data, raw_dtype = gguf_payload(arr, GGMLQuantizationType.F32)
        w.add_tensor(g, data, raw_shape=None, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return arrays


def read_gguf(path: Path):
    """(arch, {key: value} of the arch's keys without the prefix, {tensor: float64 numpy array})."""
    r = GGUFReader(str(path))
    arch = r.fields["general.architecture"].contents()
    kv = {k[len(arch) + 1:]: f.contents() for k, f in r.fields.items() if k.startswith(arch + ".")}
    W = {t.name: np.asarray(t.data).reshape([int(x) for x in reversed(t.shape)]) for t in r.tensors}
    return arch, kv, W, r


def check_gguf(path: Path, arrays, model, arch: str):
    """Names, dims (reversed numpy shapes), bytes; and every tensor maps back to its HF tensor."""
    _, kv, W, r = read_gguf(path)
    want = dict(arrays)
    assert [t.name for t in r.tensors] == [g for g, _ in arrays]
    for t in r.tensors:
        assert t.tensor_type == GGMLQuantizationType.F32
        assert list(t.shape) == list(reversed(want[t.name].shape)), (t.name, t.shape)
        assert np.array_equal(W[t.name], want[t.name]), t.name
    sd = {k: v.detach().to(torch.float32) for k, v in model.state_dict().items()}
    worst = 0.0
    for g, _t, h, _how in gguf_tensors(arch, model):
        back = torch.from_numpy(W[g].copy())
        back = qwen35_inverse(g, back, model.config) if arch == "qwen35" else (
            back[:, None, :] if g.endswith("shortconv.conv.weight") else back)
        assert back.shape == sd[h].shape, (g, back.shape, sd[h].shape)
        worst = max(worst, float((back - sd[h]).abs().max()))
    assert worst < 1e-6, worst
    return kv, worst


# --------------------------------------------------------------------------------------
# numpy float64 forward with llama.cpp's semantics
# --------------------------------------------------------------------------------------

def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def _rope_neox(x, pos, n_rot, base):
    """NeoX rotation of the first n_rot dims (pairs i, i + n_rot/2), the rest passed through."""
    ang = pos[:, None] * base ** (-np.arange(0, n_rot, 2) / n_rot)
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    a, b, rest = x[..., :n_rot // 2], x[..., n_rot // 2:n_rot], x[..., n_rot:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos, rest], -1)


def _attention(q, k, v, scale):
    T, H, _ = q.shape
    rep = H // k.shape[1]
    k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
    a = np.einsum("thd,shd->hts", q, k) * scale + np.triu(np.full((T, T), -np.inf), 1)
    a = np.exp(a - a.max(-1, keepdims=True))
    return np.einsum("hts,shd->thd", a / a.sum(-1, keepdims=True), v)


def _causal_conv(x, w):
    """Depthwise causal conv over time: x (T, C), w (C, K): y[t] = sum_k w[:, k] x[t - K + 1 + k]."""
    T, K = x.shape[0], w.shape[1]
    xp = np.concatenate([np.zeros((K - 1, x.shape[1])), x])
    return sum(xp[k:k + T] * w[:, k] for k in range(K))


def _silu(x):
    return x / (1 + np.exp(-x))


def numpy_prefill(path: Path, prompt_ids) -> np.ndarray:
    """Log-softmax at the last prompt position of an independent float64 forward over the file."""
    arch, kv, W32, _ = read_gguf(path)
    W = {k: v.astype(np.float64) for k, v in W32.items()}
    eps, T = kv["attention.layer_norm_rms_epsilon"], len(prompt_ids)
    pos = np.arange(T, dtype=np.float64)
    H, base = kv["attention.head_count"], kv["rope.freq_base"]
    hd = kv.get("attention.key_length", kv["embedding_length"] // H)  # lfm2 writes no key_length

    def ffn(h, b):
        return (_silu(h @ W[b + "ffn_gate.weight"].T) * (h @ W[b + "ffn_up.weight"].T)) @ W[b + "ffn_down.weight"].T

    x = W["token_embd.weight"][prompt_ids]
    for i in range(kv["block_count"]):
        b = f"blk.{i}."
        h = _rms(x, W[b + "attn_norm.weight"], eps)
        if arch == "qwen35" and kv["attention.recurrent_layers"][i]:
            x = x + _gated_delta_net(h, W, b, kv, eps)
        elif arch == "lfm2" and kv["attention.head_count_kv"][i] == 0:
            bcx = h @ W[b + "shortconv.in_proj.weight"].T
            B, C, xx = np.split(bcx, 3, -1)
            x = x + (C * _causal_conv(B * xx, W[b + "shortconv.conv.weight"])) @ W[b + "shortconv.out_proj.weight"].T
        else:
            KV = kv["attention.head_count_kv"]
            KV = KV[i] if isinstance(KV, list) else KV
            n_rot = kv.get("rope.dimension_count", hd)
            q = (h @ W[b + "attn_q.weight"].T).reshape(T, H, -1)
            gate = None
            if arch == "qwen35":  # per head: hd query values, then hd gate values
                q, gate = q[..., :hd], q[..., hd:].reshape(T, H * hd)
            q = _rope_neox(_rms(q, W[b + "attn_q_norm.weight"], eps), pos, n_rot, base)
            k = _rope_neox(_rms((h @ W[b + "attn_k.weight"].T).reshape(T, KV, hd), W[b + "attn_k_norm.weight"], eps),
                           pos, n_rot, base)
            o = _attention(q, k, (h @ W[b + "attn_v.weight"].T).reshape(T, KV, hd), hd ** -0.5).reshape(T, H * hd)
            if gate is not None:
                o = o / (1 + np.exp(-gate))
            x = x + o @ W[b + "attn_output.weight"].T
        post = "post_attention_norm.weight" if arch == "qwen35" else "ffn_norm.weight"
        x = x + ffn(_rms(x, W[b + post], eps), b)
    final = "output_norm.weight" if arch == "qwen35" else "token_embd_norm.weight"
    logits = _rms(x[-1], W[final], eps) @ W.get("output.weight", W["token_embd.weight"]).T
    logits = logits - logits.max()
    return logits - np.log(np.exp(logits).sum())


def _gated_delta_net(h, W, b, kv, eps):
    """llama.cpp's qwen35 linear-attention layer: conv + SiLU over [q, k, v], L2-normed q/k
    (x / sqrt(sum x^2 + eps)), q scaled by 1/sqrt(d_k), value head j reading key head j % n_k
    (tiled), the gated delta rule one token at a time, gated RMSNorm, output projection."""
    T = h.shape[0]
    dk, nk, nv = kv["ssm.state_size"], kv["ssm.group_count"], kv["ssm.time_step_rank"]
    dv = kv["ssm.inner_size"] // nv
    mixed = _silu(_causal_conv(h @ W[b + "attn_qkv.weight"].T, W[b + "ssm_conv1d.weight"]))
    l2 = lambda t: t / np.sqrt((t * t).sum(-1, keepdims=True) + eps)  # noqa: E731
    q = l2(mixed[:, :nk * dk].reshape(T, nk, dk)) / np.sqrt(dk)
    k = l2(mixed[:, nk * dk:2 * nk * dk].reshape(T, nk, dk))
    v = mixed[:, 2 * nk * dk:].reshape(T, nv, dv)
    beta = 1 / (1 + np.exp(-(h @ W[b + "ssm_beta.weight"].T)))
    a = h @ W[b + "ssm_alpha.weight"].T + W[b + "ssm_dt.bias"]
    g = W[b + "ssm_a"] * np.logaddexp(0, a)  # ssm_a = -exp(A_log), times softplus
    S = np.zeros((nv, dk, dv))
    o = np.zeros((T, nv, dv))
    kh = np.arange(nv) % nk
    for t in range(T):
        S *= np.exp(g[t])[:, None, None]
        kt, qt = k[t, kh], q[t, kh]
        delta = (v[t] - np.einsum("jk,jkv->jv", kt, S)) * beta[t][:, None]
        S += kt[:, :, None] * delta[:, None, :]
        o[t] = np.einsum("jk,jkv->jv", qt, S)
    z = (h @ W[b + "attn_gate.weight"].T).reshape(T, nv, dv)
    o = _rms(o, W[b + "ssm_norm.weight"], eps) * _silu(z)
    return o.reshape(T, nv * dv) @ W[b + "ssm_out.weight"].T
