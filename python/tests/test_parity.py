"""HF transformers / PEFT parity through the Python binding: the same references the Node
suite checks (greedy tokens identical, |Δlogprob| ≤ 1e-4 at f32)."""

import pytest

from conftest import ADAPTERS, FIXTURES, MODELS, assert_steps, fixture_json
from expert_runtime import Runtime


@pytest.mark.parametrize("name", MODELS)
def test_greedy_parity_with_hf(name):
    ref = fixture_json(name, "reference.json")
    steps = ref["f32"]["steps"]
    with Runtime.load(FIXTURES / name) as rt:
        s = rt.create_session()
        stream = s.generate({"tokens": ref["prompt_ids"]}, max_tokens=len(steps), temperature=0, top_logprobs=5)
        chunks = list(stream)
        assert_steps(chunks, steps, name)
        for i, c in enumerate(chunks):
            assert [t for t, _ in c.top_logprobs] == [t for t, _ in steps[i]["top5"]], f"step {i} top-5"
        r = stream.result
        assert r.tokens == [x["token"] for x in steps]
        assert r.finish_reason == "length"
        assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.cached_tokens) == (len(ref["prompt_ids"]), len(steps), 0)


def test_gguf_f32_equals_hf():
    ref = fixture_json("qwen3-tiny", "reference.json")
    steps = ref["f32"]["steps"]
    with Runtime.load(FIXTURES / "qwen3-tiny" / "model-f32.gguf") as rt:
        chunks = list(rt.create_session().generate({"tokens": ref["prompt_ids"]}, max_tokens=len(steps), temperature=0))
        assert_steps(chunks, steps, "qwen3-tiny f32 GGUF")


REF = fixture_json("adapters", "reference.json")
CASES = sorted(REF["cases"].items(), key=lambda kv: kv[1]["base"])


@pytest.fixture(scope="module")
def runtimes():
    """One runtime per base with every expert its cases use."""
    out = {}
    for _, c in CASES:
        rt = out.get(c["base"])
        if rt is None:
            rt = out[c["base"]] = Runtime.load(FIXTURES / c["base"])
        for n in c["experts"]:
            if n not in [e.name for e in rt.experts()]:
                rt.load_expert(ADAPTERS / n, name=n)
    yield out
    for rt in out.values():
        rt.close()


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_experts_match_peft(runtimes, name, case):
    rt = runtimes[case["base"]]
    s = rt.create_session()
    r = s.generate({"tokens": case["prompt_ids"]}, max_tokens=len(case["steps"]), temperature=0, experts=case["experts"])
    chunks = list(r)
    assert_steps(chunks, case["steps"], name)
    assert r.result.experts == case["experts"] or sorted(r.result.experts) == sorted(case["experts"])


def test_session_default_experts(runtimes):
    c = REF["cases"]["lora"]
    rt = runtimes["qwen3-tiny"]
    with rt.create_session(experts=["lora"]) as s:
        assert s.experts == ["lora"]
        r = s.complete({"tokens": c["prompt_ids"]}, max_tokens=len(c["steps"]), temperature=0)
        assert r.tokens == [x["token"] for x in c["steps"]]
        s.set_experts([])
        base = REF["cases"]["qwen3-tiny"]
        s.reset()
        r = s.complete({"tokens": base["prompt_ids"]}, max_tokens=len(base["steps"]), temperature=0)
        assert r.tokens == [x["token"] for x in base["steps"]]


def test_speculative_ngram_keeps_the_reference_tokens():
    ref = fixture_json("qwen3-tiny", "reference.json")
    steps = ref["f32"]["steps"]
    with Runtime.load(FIXTURES / "qwen3-tiny") as rt:
        stream = rt.create_session().generate(
            {"tokens": ref["prompt_ids"]},
            max_tokens=len(steps),
            temperature=0,
            speculative={"type": "ngram", "ngram": 1, "min_ngram": 1, "max_draft": 4},
        )
        assert_steps(list(stream), steps, "qwen3-tiny speculative")
        u = stream.result.usage
        assert 0 < u.draft_tokens and 0 <= u.accepted_draft_tokens <= u.draft_tokens
        for bad in [
            {"type": "ngram", "max_draft": 0},
            {"type": "ngram", "max_draft": 2**40},
            {"type": "ngram", "max_draft": -1},
            {"type": "ngram", "ngram": "3"},
            {"type": "ngram", "ngram": float("nan")},
            {"type": "draft"},
            {"type": "ngram", "bogus": 1},
            "ngram",
        ]:
            with pytest.raises(Exception) as e:
                rt.create_session().complete({"tokens": [1, 2]}, max_tokens=2, speculative=bad)
            assert getattr(e.value, "code", None) == "INVALID_ARGUMENT", bad


def test_speculative_draft_model_keeps_the_reference_tokens():
    ref = fixture_json("qwen3-tiny", "reference.json")
    steps = ref["f32"]["steps"]
    with Runtime.load(FIXTURES / "qwen3-tiny") as rt, Runtime.load(FIXTURES / "qwen3-tiny") as same, Runtime.load(
        FIXTURES / "llama-tiny"
    ) as other:
        for draft, name in [(same, "the same model"), (other, "llama-tiny")]:
            stream = rt.create_session().generate(
                {"tokens": ref["prompt_ids"]},
                max_tokens=len(steps),
                temperature=0,
                speculative={"type": "draft", "model": draft, "max_draft": 4},
            )
            assert_steps(list(stream), steps, f"qwen3-tiny drafted by {name}")
            u = stream.result.usage
            assert 0 < u.draft_tokens and 0 <= u.accepted_draft_tokens <= u.draft_tokens, (name, u.draft_tokens)
            if draft is same:  # another model (random weights) keeps few or none
                assert u.accepted_draft_tokens >= 0.9 * u.draft_tokens, (u.draft_tokens, u.accepted_draft_tokens)
        for bad in [
            {"type": "draft", "model": "qwen3-tiny"},
            {"type": "draft", "model": same, "ngram": 2},
            {"type": "ngram", "model": same},
            {"type": "draft", "model": same, "max_draft": 65},
        ]:
            with pytest.raises(Exception) as e:
                rt.create_session().complete({"tokens": [1, 2]}, max_tokens=2, speculative=bad)
            assert getattr(e.value, "code", None) == "INVALID_ARGUMENT", bad
        gone = Runtime.load(FIXTURES / "llama-tiny")
        gone.close()
        with pytest.raises(Exception) as e:
            rt.create_session().complete({"tokens": [1, 2]}, max_tokens=2, speculative={"type": "draft", "model": gone})
        assert getattr(e.value, "code", None) == "DISPOSED"
