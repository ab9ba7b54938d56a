"""Ray Serve for expert-runtime: experts as multiplexed models.

Each replica of :class:`ExpertServer` holds one :class:`~expert_runtime.Runtime`. An expert is a
Ray Serve *multiplexed model*: a request names it (``serve_multiplexed_model_id``, which the
ingress sets from the OpenAI ``model`` field), Ray routes it to a replica that already holds
that expert when there is one, and the replica loads it from ``experts_dir`` on first use,
unloading its least recently used expert beyond ``max_experts_per_replica``. The base model is
the empty id.

:func:`app` builds the application: an OpenAI-shaped ingress (``POST /v1/chat/completions``,
``GET /v1/models``) in front of the replicas::

    from ray import serve
    from expert_runtime.ray import app
    serve.run(app("/models/SmolLM2.gguf", experts_dir="/experts", num_replicas=2))

Ray is not a dependency of expert-runtime: ``pip install "ray[serve]"``.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import uuid
from typing import Any

try:
    from ray import serve
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("expert_runtime.ray needs Ray Serve: pip install 'ray[serve]'") from e

from . import ExpertRuntimeError, Runtime

__all__ = ["ExpertServer", "Ingress", "app", "build_app"]

#: An expert's id: a directory name in ``experts_dir`` (no separators, not ``.`` or ``..``).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_EXPERTS_PER_REPLICA = 4


def _error(code: str, detail: str) -> ExpertRuntimeError:
    """An ``ExpertRuntimeError`` as the engine raises them (``code``, ``detail``)."""
    e = ExpertRuntimeError(f"{code}: {detail}")
    e.code = code
    e.detail = detail
    return e


def _replica_id() -> str:
    ctx = serve.get_replica_context()
    rid = getattr(ctx, "replica_id", None)
    return str(getattr(rid, "unique_id", None) or getattr(ctx, "replica_tag", None) or rid)


class _Loaded:
    """A loaded expert; Ray Serve calls ``__del__`` when it evicts it, which unloads it."""

    def __init__(self, expert: Any, name: str):
        self.expert = expert
        self.name = name
        self._gone = False

    def __del__(self) -> None:
        if not self._gone:
            self._gone = True
            try:
                self.expert.unload()
            except Exception:  # already unloaded, or the runtime is gone
                pass


def _expert_path(experts_dir: str | None, name: str) -> str:
    if not experts_dir:
        raise _error("EXPERT_NOT_FOUND", f"no experts directory: cannot load '{name}'")
    if not _NAME.match(name) or ".." in name:
        raise _error("INVALID_ARGUMENT", "an expert id is a directory name in the experts directory (letters, digits, . _ -)")
    root = os.path.realpath(experts_dir)
    path = os.path.realpath(os.path.join(root, name))
    if not path.startswith(root + os.sep) or not os.path.isdir(path):
        raise _error("EXPERT_NOT_FOUND", f"no expert directory named '{name}'")
    return path


@serve.deployment
class ExpertServer:
    """A replica: one runtime, experts loaded on demand as multiplexed models."""

    def __init__(self, model: str, experts_dir: str | None = None, **load_options: Any):
        self.rt = Runtime.load(model, **load_options)
        self.experts_dir = experts_dir
        self.replica = _replica_id()
        #: Loads per expert on this replica (a request that found its expert here loads none).
        self.loads: dict[str, int] = {}

    @serve.multiplexed(max_num_models_per_replica=MAX_EXPERTS_PER_REPLICA)
    async def expert(self, name: str) -> _Loaded:
        path = _expert_path(self.experts_dir, name)
        e = await asyncio.to_thread(self.rt.load_expert, path, name=name)
        self.loads[name] = self.loads.get(name, 0) + 1
        return _Loaded(e, name)

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """An OpenAI chat completion for ``body``, under the request's multiplexed expert."""
        name = serve.get_multiplexed_model_id()
        experts: list[str] = []
        loads_before = self.loads.get(name, 0)
        if name:
            experts = [(await self.expert(name)).name]
        loaded = self.loads.get(name, 0) > loads_before
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _error("INVALID_ARGUMENT", "messages must be a non-empty list")
        options: dict[str, Any] = {"experts": experts}
        for key in ("max_tokens", "temperature", "top_p", "seed"):
            if body.get(key) is not None:
                options[key] = body[key]
        session = self.rt.create_session()
        r = await asyncio.to_thread(session.complete, messages, **options)
        usage = r.usage
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": name or "base",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": r.text}, "finish_reason": r.finish_reason}],
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            },
            # Which replica answered, and whether it had to load the expert for this request.
            "expert_runtime": {"replica": self.replica, "experts": experts, "loaded": loaded},
        }

    def experts(self) -> list[str]:
        """The experts this replica holds now."""
        return [e.name for e in self.rt.experts]


@serve.deployment
class Ingress:
    """OpenAI-shaped HTTP in front of :class:`ExpertServer`: ``model`` names the expert (the
    multiplexed model id); ``base`` (or no model) is the base model."""

    def __init__(self, server: Any, base: str = "base"):
        self.server = server
        self.base = base

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        path = request.url.path.rstrip("/")
        if request.method == "GET" and path == "/v1/models":
            return JSONResponse({"object": "list", "data": [{"id": self.base, "object": "model", "owned_by": "expert-runtime"}]})
        if request.method != "POST" or path != "/v1/chat/completions":
            return JSONResponse({"error": {"message": f"no route {request.method} {path}", "type": "invalid_request_error"}}, status_code=404)
        try:
            body = await request.json()
        except Exception:
            return JSONResponse({"error": {"message": "the body must be JSON", "type": "invalid_request_error"}}, status_code=400)
        if not isinstance(body, dict):
            return JSONResponse({"error": {"message": "the body must be a JSON object", "type": "invalid_request_error"}}, status_code=400)
        model = body.get("model") or self.base
        if not isinstance(model, str):
            return JSONResponse({"error": {"message": "model must be a string", "type": "invalid_request_error"}}, status_code=400)
        expert = "" if model == self.base else model
        try:
            answer = await self.server.options(multiplexed_model_id=expert).chat.remote(body)
        except Exception as e:  # the replica's error, typed
            cause = getattr(e, "cause", None) or e
            code = getattr(cause, "code", None)
            status = 404 if code == "EXPERT_NOT_FOUND" else 400 if code in ("INVALID_ARGUMENT", "CONTEXT_OVERFLOW") else 500
            return JSONResponse({"error": {"message": str(cause), "type": "invalid_request_error" if status < 500 else "server_error", "code": code}}, status_code=status)
        return JSONResponse(answer)


def app(model: str, experts_dir: str | None = None, num_replicas: int = 1, base: str = "base", **load_options: Any) -> Any:
    """The Ray Serve application: :class:`Ingress` over ``num_replicas`` :class:`ExpertServer`s."""
    server = ExpertServer.options(num_replicas=num_replicas).bind(model, experts_dir, **load_options)
    return Ingress.bind(server, base)


def build_app(args: dict[str, Any]) -> Any:
    """:func:`app` from a Serve config's ``args`` (``import_path: expert_runtime.ray:build_app``):
    ``model`` (required), ``experts_dir``, ``num_replicas``, ``base``, and load options."""
    if not isinstance(args, dict) or not isinstance(args.get("model"), str):
        raise _error("INVALID_ARGUMENT", "the application's args need 'model' (a path)")
    a = dict(args)
    return app(a.pop("model"), a.pop("experts_dir", None), int(a.pop("num_replicas", 1)), a.pop("base", "base"), **a)
