"""Every failure is an ExpertRuntimeError with Node's stable code; hostile values (2**40, NaN,
bools for numbers, wrong shapes, 2 MB strings, cycles) are refused and the runtime lives on."""

import math

import pytest

from conftest import ADAPTERS, FIXTURES
from expert_runtime import ExpertRuntimeError, Runtime


def code_of(fn):
    with pytest.raises(ExpertRuntimeError) as e:
        fn()
    assert str(e.value).startswith(e.value.code + ": ")
    # The code once, then what happened (not 'DISPOSED: disposed: …').
    kind = e.value.code.lower().replace("_", " ")
    assert not str(e.value).lower().startswith(f"{kind}: {kind}"), str(e.value)
    return e.value.code


def test_messages_say_it_once_and_what_to_do(tiny):
    for v in (0, -1):
        with pytest.raises(ExpertRuntimeError) as e:
            tiny.create_session().complete("hi", max_tokens=v)
        assert str(e.value) == f"INVALID_ARGUMENT: max_tokens must be a positive integer (1 to 4294967295), got {v}"
    with pytest.raises(ExpertRuntimeError) as e:
        tiny.create_session().complete("hi", max_tokns=3)
    assert "unknown option 'max_tokns' (did you mean 'max_tokens'?)" in str(e.value), str(e.value)
    rt = Runtime.load(FIXTURES / "qwen3-tiny")
    rt.close()
    with pytest.raises(ExpertRuntimeError) as e:
        rt.create_session()
    assert str(e.value) == "DISPOSED: the runtime was disposed"


def test_load_errors(tmp_path):
    assert code_of(lambda: Runtime.load(tmp_path / "missing")) == "MODEL_NOT_FOUND"
    (tmp_path / "config.json").write_text("{not json")
    assert code_of(lambda: Runtime.load(tmp_path)) in ("INVALID_MODEL", "MODEL_NOT_FOUND")
    assert code_of(lambda: Runtime.load(FIXTURES / "qwen3-tiny", bogus=1)) == "INVALID_ARGUMENT"
    assert code_of(lambda: Runtime.load(FIXTURES / "qwen3-tiny", kv_cache={"max_tokens": 2**70})) == "INVALID_ARGUMENT"
    assert code_of(lambda: Runtime.load(FIXTURES / "qwen3-tiny", threads=-1)) == "INVALID_ARGUMENT"
    assert code_of(lambda: Runtime.load(FIXTURES / "qwen3-tiny", device="tpu")) == "INVALID_ARGUMENT"
    assert code_of(lambda: Runtime.load(FIXTURES / "qwen3-tiny", on_progress=3)) == "INVALID_ARGUMENT"
    assert code_of(lambda: Runtime.load(b"/bytes/path")) == "INVALID_ARGUMENT"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_on_progress_is_called_and_may_raise():
    calls = []

    def progress(loaded, total):
        calls.append((loaded, total))
        raise RuntimeError("a broken callback does not break loading")

    with Runtime.load(FIXTURES / "qwen3-tiny", on_progress=progress) as rt:
        assert rt.info["architecture"] == "qwen3"
    assert calls and calls[-1][0] == calls[-1][1]


HOSTILE = [
    dict(max_tokens=2**40),
    dict(max_tokens=-1),
    dict(max_tokens=True),
    dict(max_tokens=3.5),
    dict(temperature=math.nan),
    dict(temperature=-1),
    dict(temperature=math.inf),
    dict(temperature="hot"),
    dict(top_p=2.0),
    dict(top_k=2**33),
    dict(seed=-5),
    dict(seed=2**80),
    dict(top_logprobs=10**6),
    dict(stop=[1, 2]),
    dict(experts="everything"),
    dict(experts=[3]),
    dict(enable_thinking=1),
    dict(unknown_option=1),
    dict(response_format={"type": "yaml"}),
    dict(response_format={"type": "json_schema"}),
    dict(response_format={"type": "json_schema", "schema": {"type": "number", "minimum": math.nan}}),
    dict(response_format={"type": "regex", "pattern": "("}),
    dict(response_format={"type": "grammar", "grammar": "start: undefined_rule"}),
    dict(response_format="json"),
    dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]),
    dict(tools=[{"type": "nope"}]),
    dict(tools={"a": 1}),
    dict(tool_choice="sometimes"),
    dict(tool_choice={"type": "function", "function": {"name": "missing"}}, tools=[{"type": "function", "function": {"name": "a"}}]),
]


@pytest.mark.parametrize("opts", HOSTILE, ids=[str(sorted(o))[:60] + str(i) for i, o in enumerate(HOSTILE)])
def test_hostile_options_are_invalid_argument(tiny, opts):
    s = tiny.create_session()
    assert code_of(lambda: s.complete("hi", **opts)) in ("INVALID_ARGUMENT", "EXPERT_NOT_FOUND")
    assert s.complete("hi", max_tokens=1).usage.completion_tokens == 1


def test_a_2mb_stop_string_is_only_text(tiny):
    r = tiny.create_session().complete("hi", max_tokens=8, stop="x" * (2 << 20))
    assert r.usage.completion_tokens <= 8


def test_cyclic_and_deep_schemas(tiny):
    s = tiny.create_session()
    cyclic = {"type": "object"}
    cyclic["properties"] = {"self": cyclic}
    assert code_of(lambda: s.complete("hi", response_format={"type": "json_schema", "schema": cyclic})) == "INVALID_ARGUMENT"
    deep = {}
    cur = deep
    for _ in range(5000):
        cur["items"] = {}
        cur = cur["items"]
    assert code_of(lambda: s.complete("hi", response_format={"type": "json_schema", "schema": deep})) == "INVALID_ARGUMENT"


BAD_INPUTS = [
    None,
    3,
    b"bytes",
    {"text": 3},
    {"tokens": [1, -1]},
    {"tokens": [2**32]},
    {"tokens": "abc"},
    {"text": "a", "tokens": [1]},
    [{"role": "user"}],
    [{"content": "x"}],
    [{"role": "user", "content": "x", "extra": 1}],
    [{"role": "assistant", "content": None, "tool_calls": [{"id": 1}]}],
    ["just a string"],
    "\ud800",
]


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=[repr(b)[:40] for b in BAD_INPUTS])
def test_bad_inputs(tiny, bad):
    assert code_of(lambda: tiny.create_session().complete(bad, max_tokens=1)) == "INVALID_ARGUMENT"


def test_out_of_vocabulary_token_and_context_overflow(tiny):
    s = tiny.create_session()
    assert code_of(lambda: s.complete({"tokens": [10**6]}, max_tokens=1)) == "INVALID_ARGUMENT"
    assert code_of(lambda: s.complete({"tokens": [5] * 5000}, max_tokens=1)) == "CONTEXT_OVERFLOW"
    assert code_of(lambda: tiny.detokenize([10**6])) == "INVALID_ARGUMENT"
    assert code_of(lambda: tiny.tokenize(3)) == "INVALID_ARGUMENT"


def test_expert_errors(tiny, tmp_path):
    assert code_of(lambda: tiny.create_session(experts=["nope"])) == "EXPERT_NOT_FOUND"
    assert code_of(lambda: tiny.load_expert(tmp_path)) in ("INVALID_ADAPTER", "MODEL_NOT_FOUND")
    assert code_of(lambda: tiny.load_expert(ADAPTERS / "lora_qwen2")) == "INVALID_ADAPTER"
    assert code_of(lambda: tiny.load_expert(ADAPTERS / "lora", scale="big")) == "INVALID_ARGUMENT"
    e = tiny.load_expert(ADAPTERS / "lora", name="err-lora")
    assert e.loaded and e.kind == "lora" and e.rank == 4 and e.bytes > 0
    assert e.mapped_bytes == e.bytes  # f32 factors read in place from the file
    assert code_of(lambda: tiny.load_expert(ADAPTERS / "lora", name="x", mmap="yes")) == "INVALID_ARGUMENT"
    copied = tiny.load_expert(ADAPTERS / "lora", name="err-lora-copied", mmap=False)
    assert (copied.bytes, copied.mapped_bytes) == (e.bytes, 0)
    assert copied.unload() is True
    assert e.unload() is True
    assert not e.loaded and e.unload() is False
    assert code_of(lambda: tiny.create_session().complete("hi", experts=["err-lora"])) == "EXPERT_NOT_FOUND"


def test_embed_and_route_errors(tiny):
    assert code_of(lambda: tiny.embed("a bare string")) == "INVALID_ARGUMENT"
    assert code_of(lambda: tiny.embed([""])) == "INVALID_ARGUMENT"
    assert code_of(lambda: tiny.embed(["x"], pooling="max")) == "INVALID_ARGUMENT"
    assert code_of(lambda: tiny.set_router(threshold="high")) == "INVALID_ARGUMENT"
    assert code_of(lambda: tiny.set_router(weights={"nope": 1})) == "INVALID_ARGUMENT"
    assert code_of(lambda: tiny.set_router(generic_patterns=["("])) == "INVALID_ARGUMENT"


def test_disposed():
    rt = Runtime.load(FIXTURES / "qwen3-tiny")
    s = rt.create_session()
    stream = s.generate("story", max_tokens=400, temperature=0)
    rt.close()
    assert rt.closed and s.closed
    # The running request ends (cancelled or with DISPOSED), it never hangs.
    try:
        for _ in stream:
            pass
    except ExpertRuntimeError as e:
        assert e.code == "DISPOSED"
    for fn in (lambda: s.complete("x"), lambda: rt.create_session(), lambda: rt.info, lambda: rt.stats(), lambda: rt.embed(["x"])):
        assert code_of(fn) == "DISPOSED"
    rt.close()  # twice is fine
