"""Fit the machine (issue 52): `context_length="auto"` under `memory_limit`, a model that cannot
fit refused before its weights are read, and `stats()["memory"]` by kind."""

import pytest

from conftest import FIXTURES

YARN = {"type": "yarn", "factor": 8, "original_max_position_embeddings": 512}


def test_auto_context_fits_the_limit_and_a_model_too_large_is_refused():
    from expert_runtime import ExpertRuntimeError, Runtime

    with Runtime.load(FIXTURES / "qwen3-tiny", rope_scaling=YARN) as rt:
        per_token = rt.stats()["kv_bytes_per_token"]
    # Everything but the KV is under 4 MB for this tiny model: 'auto' fills the rest, up to the
    # 4,096 positions YaRN gives it.
    with Runtime.load(FIXTURES / "qwen3-tiny", rope_scaling=YARN, context_length="auto", memory_limit=8 << 20) as rt:
        n = rt.info["context_length"]
        assert 512 <= n <= 4096 and n % 16 == 0
        assert n * per_token <= 8 << 20
    with pytest.raises(ExpertRuntimeError) as e:
        Runtime.load(FIXTURES / "qwen3-tiny", memory_limit=1000)
    assert e.value.code == "OUT_OF_MEMORY"
    with pytest.raises(ExpertRuntimeError) as e:
        Runtime.load(FIXTURES / "qwen3-tiny", context_length="most")
    assert e.value.code == "INVALID_ARGUMENT"


def test_stats_report_resident_memory_by_kind():
    from expert_runtime import Runtime

    with Runtime.load(FIXTURES / "qwen3-tiny") as rt:
        m = rt.stats()["memory"]
        assert m["weights"] == rt.info["weight_bytes"]
        assert (m["kv"], m["state"], m["experts"]) == (0, 0, 0)
        rt.create_session().complete("Hello there", max_tokens=3, temperature=0)
        assert rt.stats()["memory"]["kv"] > 0
