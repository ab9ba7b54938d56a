"""Many sessions at once, from threads and from asyncio: each answer equals the same request
run alone (greedy), and cancellation from asyncio stops the request."""

import asyncio
import threading

from conftest import ADAPTERS, FIXTURES, fixture_json
from expert_runtime import Runtime

REF = fixture_json("adapters", "reference.json")["cases"]
MIX = [[], ["lora"], ["dora"], ["ia3"], ["lokr"], ["lora", "lora2"], ["prompt"], ["rslora"]]


def load_with_experts():
    rt = Runtime.load(FIXTURES / "qwen3-tiny")
    for n in {n for m in MIX for n in m}:
        rt.load_expert(ADAPTERS / n, name=n)
    return rt


def expected(experts):
    key = "+".join(experts) if experts else "qwen3-tiny"
    c = REF[key]
    return c["prompt_ids"], [s["token"] for s in c["steps"]]


def test_threads_with_mixed_experts_equal_peft():
    with load_with_experts() as rt:
        results = {}
        errors = []

        def run(i, experts):
            try:
                prompt, want = expected(experts)
                r = rt.create_session().complete({"tokens": prompt}, max_tokens=len(want), temperature=0, experts=experts)
                results[i] = (r.tokens, want)
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i, MIX[i % len(MIX)])) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(results) == 16
        for i, (got, want) in results.items():
            assert got == want, f"session {i} ({MIX[i % len(MIX)]})"


def test_asyncio_sessions_equal_peft():
    async def main():
        rt = await Runtime.aload(FIXTURES / "qwen3-tiny")
        try:
            for n in {n for m in MIX for n in m}:
                rt.load_expert(ADAPTERS / n, name=n)

            async def one(experts):
                prompt, want = expected(experts)
                s = rt.create_session()
                tokens = [c.token_id async for c in s.agenerate({"tokens": prompt}, max_tokens=len(want), temperature=0, experts=experts)]
                done = await rt.create_session().acomplete({"tokens": prompt}, max_tokens=len(want), temperature=0, experts=experts)
                return tokens, done.tokens, want

            for tokens, done, want in await asyncio.gather(*(one(m) for m in MIX * 2)):
                assert tokens == want
                assert done == want
        finally:
            rt.close()

    asyncio.run(main())


def test_asyncio_cancel_and_aclose():
    async def main():
        with Runtime.load(FIXTURES / "qwen3-tiny") as rt:
            s = rt.create_session()
            stream = s.agenerate("story", max_tokens=400, temperature=0)
            first = await stream.__anext__()
            await stream.aclose()
            assert stream.result.finish_reason == "cancelled"
            assert stream.result.tokens == [first.token_id]
            assert not s.busy

            # Cancelling the task awaiting acomplete cancels the request.
            task = asyncio.ensure_future(s.acomplete("story", max_tokens=100000, temperature=0))
            await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            assert task.cancelled()
            for _ in range(200):
                if not s.busy:
                    break
                await asyncio.sleep(0.01)
            assert not s.busy
            r = await s.acomplete("again", max_tokens=2, temperature=0)
            assert r.usage.completion_tokens == 2

            # async with closes the stream.
            async with s.agenerate("story", max_tokens=400, temperature=0) as st:
                async for _ in st:
                    break
            assert st.result.finish_reason == "cancelled"

    asyncio.run(main())
