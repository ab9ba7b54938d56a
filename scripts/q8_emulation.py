"""Quantize-on-load q8_0's arithmetic, emulated in HF: the reference a routed (mixture-of-experts)
model's q8_0 run is checked against, since its picks are too sensitive to compare it with the f32
run. Used by gen_qwen3moe_fixtures.py and gen_gemma4_moe_fixture.py ("q8_0" in reference.json).
"""

from __future__ import annotations

import contextlib
import copy

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from gen_fixtures import greedy_reference

Q8 = GGMLQuantizationType.Q8_0


@contextlib.contextmanager
def q8_0_activations(keep):
    """Every F.linear (experts' included) multiplies Q8_0-rounded activations, as llama.cpp's and
    the engine's Q8_0 integer dot products do, except for the weights in `keep` (the routers)."""
    import torch.nn.functional as F
    orig = F.linear

    def linear(x, w, b=None):
        if id(w) in keep or x.shape[-1] % 32:
            return orig(x, w, b)
        a = x.detach().reshape(-1, x.shape[-1]).numpy().astype(np.float32)
        a = quants.dequantize(quants.quantize(a, Q8), Q8)
        return orig(torch.from_numpy(a.reshape(x.shape).astype(np.float32)), w, b)

    F.linear = linear
    try:
        yield
    finally:
        F.linear = orig


def q8_0_reference(model, prompt_ids, keep=()):
    """HF's greedy run as the engine's quantize-on-load q8_0 computes it: every matrix whose rows
    are whole Q8_0 blocks (embedding, projections, MoE experts, head) rounded to Q8_0, the
    parameters in `keep` (routers, which stay dense) and the norms kept, and the activations of
    each product rounded to Q8_0 too (the engine's integer dot products, as llama.cpp's)."""
    names = {id(p): n for n, p in model.named_parameters()}
    keep_names = {names[id(p)] for p in keep}
    m = copy.deepcopy(model).eval()
    keep = {id(p) for n, p in m.named_parameters() if n in keep_names}
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() >= 2 and p.shape[-1] % 32 == 0 and id(p) not in keep:
                a = p.detach().reshape(-1, p.shape[-1]).numpy().astype(np.float32)
                a = quants.dequantize(quants.quantize(a, Q8), Q8)
                p.copy_(torch.from_numpy(a.reshape(p.shape).astype(np.float32)))
    with q8_0_activations(keep):
        r, _ = greedy_reference(m, prompt_ids)
    return r
