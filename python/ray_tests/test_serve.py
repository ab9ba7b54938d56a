"""Ray Serve with experts as multiplexed models (issue 53), on one machine: 2 replicas of
``expert_runtime.ray.ExpertServer`` behind the OpenAI-shaped ingress, requests for 3 experts and
the base model. Every answer equals the in-process greedy answer; once Ray's router has learned
where each expert lives, every request for it goes to the replica that loaded it.

Not part of ``npm test`` (Ray is heavy): ``node scripts/ray-check.mjs`` runs it."""

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from expert_runtime import Runtime  # noqa: E402
from expert_runtime.ray import app, build_app  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "__test__" / "fixtures"
MODEL = FIXTURES / "qwen3-tiny"
ADAPTERS = FIXTURES / "adapters"
EXPERTS = ["lora", "dora", "ia3"]
PORT = 18431
MESSAGES = [{"role": "user", "content": "Say something about the sea."}]


def post(body, path="/v1/chat/completions"):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def serving():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    t0 = time.monotonic()
    serve.run(app(str(MODEL), experts_dir=str(ADAPTERS), num_replicas=2, threads=1), route_prefix="/")
    print(f"\nserve.run: 2 replicas ready in {time.monotonic() - t0:.1f} s")
    yield
    serve.shutdown()
    ray.shutdown()


def chat(model):
    status, r = post({"model": model, "messages": MESSAGES, "max_tokens": 8, "temperature": 0})
    assert status == 200, r
    return r


def test_answers_equal_in_process_and_each_expert_stays_on_the_replica_that_loaded_it(serving):
    with Runtime.load(MODEL, threads=1) as rt:
        for n in EXPERTS:
            rt.load_expert(ADAPTERS / n, name=n)
        want = {n: rt.create_session().complete(MESSAGES, max_tokens=8, temperature=0, experts=[n]).text for n in EXPERTS}
        want["base"] = rt.create_session().complete(MESSAGES, max_tokens=8, temperature=0).text
    assert len(set(want.values())) > 1, "the experts change the answer"

    # Warm-up: each expert is loaded somewhere, and the router learns where (replicas report
    # the models they hold), within a bounded time.
    t0 = time.monotonic()
    settled = False
    while time.monotonic() - t0 < 60 and not settled:
        seen = {n: {chat(n)["expert_runtime"]["replica"] for _ in range(3)} for n in EXPERTS}
        settled = all(len(s) == 1 for s in seen.values())
    print(f"routing settled in {time.monotonic() - t0:.1f} s")
    assert settled, seen

    # Then: every request for an expert goes to a replica that holds it already. Ray falls back
    # to another replica when the one holding it does not answer its probe in time (a loaded
    # 2-core host); that replica then loads it once, and holds it from then on.
    served = {n: [] for n in EXPERTS}
    t0 = time.monotonic()
    n_requests = 0
    for _ in range(5):
        for n in EXPERTS + ["base"]:
            r = chat(n)
            n_requests += 1
            assert r["choices"][0]["message"]["content"] == want[n], n
            if n != "base":
                info = r["expert_runtime"]
                assert info["experts"] == [n]
                served[n].append((info["replica"], info["loaded"]))
    summary = {n: {"replicas": sorted({r for r, _ in s}), "loads": sum(l for _, l in s)} for n, s in served.items()}
    print(f"{n_requests} requests in {time.monotonic() - t0:.2f} s; per expert: {summary}")
    for n, s in served.items():
        assert summary[n]["loads"] <= 1, (n, s)
        for k, (replica, loaded) in enumerate(s):
            if loaded:
                assert all(r != replica for r, _ in s[:k]), f"{n}: {replica} loaded it again"
    assert len(set().union(*(set(v["replicas"]) for v in summary.values()))) == 2, "both replicas serve"


def test_unknown_experts_and_bad_requests_get_typed_errors(serving):
    status, r = post({"model": "nope", "messages": MESSAGES})
    assert status == 404 and r["error"]["code"] == "EXPERT_NOT_FOUND", r
    status, r = post({"model": "../llama-tiny", "messages": MESSAGES})
    assert status == 400 and r["error"]["code"] == "INVALID_ARGUMENT", r
    status, r = post({"model": "lora", "messages": []})
    assert status == 400, r
    status, r = post({"messages": MESSAGES}, path="/v1/other")
    assert status == 404, r


def test_a_serve_config_builds_the_application():
    from ray.serve import Application

    assert isinstance(build_app({"model": str(MODEL), "experts_dir": str(ADAPTERS), "num_replicas": 2}), Application)
    with pytest.raises(Exception) as e:
        build_app({"experts_dir": str(ADAPTERS)})
    assert getattr(e.value, "code", None) == "INVALID_ARGUMENT"
