"""Shared fixtures of the Python suite: the same tiny HF/PEFT fixtures as the Node suite
(__test__/fixtures, written by the committed generator scripts) and the SmolLM2 GGUF that
scripts/assets.mjs fetches from PyPI (EXPERT_RUNTIME_SMOLLM2)."""

import json
import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "__test__" / "fixtures"
ADAPTERS = FIXTURES / "adapters"
LOGPROB_TOL = 1e-4
MODELS = ["qwen3-tiny", "qwen3-untied-mqa", "qwen2-tiny", "llama-tiny"]


def fixture_json(*parts):
    return json.loads(FIXTURES.joinpath(*parts).read_text())


def assert_steps(chunks, steps, what=""):
    assert [c.token_id for c in chunks] == [s["token"] for s in steps], f"{what}: greedy tokens differ from the reference"
    for i, (c, s) in enumerate(zip(chunks, steps)):
        d = abs(c.logprob - s["logprob"])
        assert d <= LOGPROB_TOL, f"{what} step {i}: logprob {c.logprob} vs reference {s['logprob']} (|d| = {d})"


@pytest.fixture(scope="module")
def tiny():
    from expert_runtime import Runtime

    with Runtime.load(FIXTURES / "qwen3-tiny") as rt:
        yield rt


@pytest.fixture(scope="session")
def smollm2_path():
    p = os.environ.get("EXPERT_RUNTIME_SMOLLM2")
    if not p or not Path(p).exists():
        pytest.skip("SmolLM2 GGUF unavailable (EXPERT_RUNTIME_SMOLLM2; `npm run fetch-assets` fetches it)")
    return p
