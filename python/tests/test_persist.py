"""Sessions saved to a file and restored (issue 52): the same engine path as Node's
`session.save` / `rt.restoreSession`, through `Session.save` and `Runtime.restore_session`."""

import pytest

from conftest import FIXTURES


def ids(seed, n):
    return [5 + ((seed * 31 + i * 17) % 90) for i in range(n)]


def turn(session, tokens):
    chunks = list(session.generate({"tokens": tokens}, max_tokens=6, temperature=0))
    return [(c.token_id, c.logprob) for c in chunks]


@pytest.mark.parametrize("model", ["llama-tiny", "qwen35-tiny"])
def test_a_restored_session_goes_on_bit_for_bit_in_a_fresh_runtime(model, tmp_path):
    from expert_runtime import Runtime

    file = tmp_path / "chat.session"
    with Runtime.load(FIXTURES / model) as rt:
        s = rt.create_session()
        turn(s, ids(1, 40))
        s.save(file)
        want = turn(s, ids(2, 7))
    with Runtime.load(FIXTURES / model) as fresh:
        r = fresh.restore_session(str(file))
        stream = r.generate({"tokens": ids(2, 7)}, max_tokens=6, temperature=0)
        got = [(c.token_id, c.logprob) for c in stream]
        assert got == want
        assert stream.result.usage.cached_tokens >= 40


def test_bad_session_files_raise_invalid_argument(tmp_path):
    from expert_runtime import ExpertRuntimeError, Runtime

    with Runtime.load(FIXTURES / "llama-tiny") as rt:
        s = rt.create_session()
        turn(s, ids(1, 10))
        good = tmp_path / "good.session"
        s.save(good)
        data = good.read_bytes()
        for name, body in [("cut", data[:-5]), ("flip", data[:-50] + bytes([data[-50] ^ 1]) + data[-49:]), ("empty", b"")]:
            p = tmp_path / name
            p.write_bytes(body)
            with pytest.raises(ExpertRuntimeError) as e:
                rt.restore_session(p)
            assert e.value.code == "INVALID_ARGUMENT"
        with pytest.raises(ExpertRuntimeError) as e:
            s.save(tmp_path / "no" / "dir" / "x.session")
        assert e.value.code == "INVALID_ARGUMENT"
        with pytest.raises(ExpertRuntimeError):
            rt.restore_session(tmp_path)
    with Runtime.load(FIXTURES / "qwen3-tiny") as other:
        with pytest.raises(ExpertRuntimeError, match="another model"):
            other.restore_session(good)


def test_the_prefix_cache_disk_tier_serves_a_later_runtime(tmp_path):
    from expert_runtime import ExpertRuntimeError, Runtime

    disk = {"dir": str(tmp_path / "tier"), "max_bytes": 64 << 20}
    prompt = ids(1, 70)

    def first(rt):
        stream = rt.create_session().generate({"tokens": prompt}, max_tokens=6, temperature=0)
        return [(c.token_id, c.logprob) for c in stream], stream.result.usage.cached_tokens

    with Runtime.load(FIXTURES / "llama-tiny", kv_cache={"disk": disk}) as rt:
        assert first(rt)[1] == 0
        ram_hit, cached = first(rt)
        assert cached == 64
    # Closing the runtime lets the writer finish: the blocks are on disk.
    with Runtime.load(FIXTURES / "llama-tiny", kv_cache={"disk": disk}) as rt:
        got, cached = first(rt)
        assert (got, cached) == (ram_hit, 64)
        assert rt.stats()["kv_disk"]["read_blocks"] == 4
    for bad in [{"dir": str(tmp_path)}, {"max_bytes": 1 << 20}, {"dir": "", "max_bytes": 1 << 20}, "x",
                {"dir": str(tmp_path), "max_bytes": 10}, {"dir": str(tmp_path), "max_bytes": 1 << 20, "other": 1}]:
        with pytest.raises(ExpertRuntimeError) as e:
            Runtime.load(FIXTURES / "llama-tiny", kv_cache={"disk": bad})
        assert e.value.code == "INVALID_ARGUMENT", bad
