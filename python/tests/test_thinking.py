"""Thinking models from Python: the same engine path as Node (__test__/thinking.test.mjs), on
the Qwen3 fixture (random weights, its real chat template): under a grammar the opening marker
is forced, exactly `budget_tokens` thought tokens follow, then the closing marker, then the
answer the grammar shapes; `thinking=False` is no thought."""

import pytest

from expert_runtime import ExpertRuntimeError


def test_budget_splits_thought_from_answer(tiny):
    opening = tiny.tokenize("<think>\n", parse_special_tokens=True)
    closing = tiny.tokenize("\n</think>\n\n", parse_special_tokens=True)
    s = tiny.create_session()
    chunks = list(s.generate("Think, then answer.", thinking={"budget_tokens": 4}, temperature=0, max_tokens=64,
                             response_format={"type": "regex", "pattern": "[a-z]{3,6}"}))
    r = s.generate("again", thinking=False, max_tokens=1).complete()
    assert r.reasoning == ""
    first = [c.token_id for c in chunks]
    assert first[: len(opening)] == opening
    assert first[len(opening) + 4 : len(opening) + 4 + len(closing)] == closing
    thought = "".join(c.reasoning or "" for c in chunks)
    assert thought == tiny.detokenize(first[len(opening) : len(opening) + 4]).strip()
    answer = "".join(c.text for c in chunks)
    assert answer.isalpha() and 3 <= len(answer) <= 6
    turn = s.history[-3]
    assert turn["role"] == "assistant" and turn["content"] == answer
    assert turn.get("reasoning") == (thought or None)


@pytest.mark.parametrize(
    "kwargs",
    [{"thinking": "yes"}, {"thinking": {"budget_tokens": -1}}, {"thinking": {"budget": 3}}, {"thinking": {}},
     {"thinking": {"budget_tokens": 1.5}}, {"thinking": True, "enable_thinking": False},
     {"thinking": {"budget_tokens": 3}, "enable_thinking": False}, {"thinking": {"budget_tokens": 2**40}}],
)
def test_hostile_thinking_options(tiny, kwargs):
    s = tiny.create_session()
    with pytest.raises(ExpertRuntimeError) as e:
        s.complete("x", max_tokens=1, **kwargs)
    assert e.value.code == "INVALID_ARGUMENT"
