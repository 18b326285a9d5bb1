"""Live servers for the serve, router and web UI tests: the real app (ninfer.serve.app) over the real ModelRouter, on
real CPU engines, run by uvicorn on a loopback port in a background thread.

- `serve_router(config)`: a router over configured models (tiny checkpoints converted to real `.ninfer` artifacts);
  nothing is resident at first. The router and web UI tests take a fresh one per module or test, since they change
  which model is resident.
- `serve_cli(argv)`: the app `ninfer-serve ARGV` builds, by the CLI's own code (with one MODEL: the one-model router,
  which loads the model on its first request).
- `qwen35_server` / `smollm2_server` (session fixtures, made available to the serve tests by
  tests/serve/conftest.py): one model each, the one-model case of the same router, made resident from the start
  (`ModelRouter.serving`, so the serve tests need not wait for a load), so every route, management routes included,
  is the real one.
  - `qwen35_server`: the tiny random Qwen3.5 checkpoint (real 248k tokenizer and chat template; thinking on by
    default, so every answer starts as reasoning). Its text is noise, which is fine for checking shapes and
    consistency.
  - `smollm2_server`: SmolLM2-135M-Instruct (bf16), a real model that answers, stops by itself, and copies a few-shot
    tool-call pattern under greedy decoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from ninfer.artifact.convert import convert
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams
from ninfer.serve.app import create_app
from ninfer.serve.router import ModelRouter, OpenEngine
from ninfer.serve.router_config import RouterConfig, parse_config
from ninfer.serve.state import ServedModel
from prometheus_client.parser import text_string_to_metric_families

# Starting the server is quick; the bound only catches a server that cannot start, so it is generous for a loaded
# 2-core machine.
STARTUP_TIMEOUT_S = 60.0


@dataclass
class LiveServer:
    url: str  # http://127.0.0.1:PORT
    router: ModelRouter
    app: Any
    engine: Engine | None = None  # the one-model servers: the engine itself, for direct calls and stats
    model_id: str | None = None
    loop: asyncio.AbstractEventLoop | None = None  # serve_router's: the server's event loop, to run its coroutines


def artifact_for(pytestconfig: pytest.Config, src: Path, draft_vocab: int | None = None) -> Path:
    """The bf16 artifact of a checkpoint folder or GGUF (with `draft_vocab`, its drafts' shortlist of that many
    rows), converted once into the pytest cache (shared with the runtime tests)."""
    folder = Path(pytestconfig.cache.mkdir("runtime-artifacts"))
    out = folder / f"{src.name}{f'.draft{draft_vocab}' if draft_vocab else ''}.bf16.ninfer"
    if not out.exists():
        convert(src, out, recipe="bf16", progress=False, draft_vocab=draft_vocab)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serve(open_router: Callable[[], Awaitable[ModelRouter]], *, webui_dir: str | None = None,
           port: int | None = None, api_keys: frozenset[str] = frozenset()) -> Iterator[tuple[str, Any]]:
    app = create_app(open_router, webui_dir=webui_dir, api_keys=api_keys)
    with _run_app(app, port) as url:
        yield url, app


@contextlib.contextmanager
def _run_app(app: Any, port: int | None = None) -> Iterator[str]:
    """Runs the app (its lifespan opens the router) on a loopback port; yields its URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the live test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)  # the lifespan closes the router and its engine


@contextlib.contextmanager
def serve_router(config: dict[str, Any], *, webui_dir: str | None = None, port: int | None = None,
                 open_engine: OpenEngine = Engine.open, api_keys: frozenset[str] = frozenset()) -> Iterator[LiveServer]:
    """`open_engine`: how the router opens an engine (tests wrap Engine.open to hold a load or see its engine)."""
    parsed = parse_config(config, defaults=EngineOptions(max_context=1024, max_concurrency=2))
    with serve_parsed_config(parsed, webui_dir=webui_dir, port=port, open_engine=open_engine,
                             api_keys=api_keys) as live:
        yield live


@contextlib.contextmanager
def serve_parsed_config(parsed: RouterConfig, *, webui_dir: str | None = None, port: int | None = None,
                        open_engine: OpenEngine = Engine.open,
                        api_keys: frozenset[str] = frozenset()) -> Iterator[LiveServer]:
    """A router over a config as ninfer-serve builds it (e.g. `ninfer.cli.serve._router_config` of its arguments)."""
    holder: dict[str, Any] = {}

    async def open_router() -> ModelRouter:
        holder["router"] = ModelRouter(parsed, open_engine=open_engine)
        holder["loop"] = asyncio.get_running_loop()
        return holder["router"]

    with _serve(open_router, webui_dir=webui_dir, port=port, api_keys=api_keys) as (url, app):
        yield LiveServer(url, holder["router"], app, loop=holder["loop"])


@contextlib.contextmanager
def serve_model(path: Path, model_id: str, max_context: int, vision: bool = False) -> Iterator[LiveServer]:
    engine = Engine.open_sync(path, EngineOptions(max_context=max_context, max_concurrency=2, vision=vision))
    router = ModelRouter.serving(ServedModel(model_id, engine))

    async def open_router() -> ModelRouter:
        return router

    with _serve(open_router) as (url, app):
        yield LiveServer(url, router, app, engine, model_id)


@contextlib.contextmanager
def serve_model_with_keys(path: Path, api_keys: frozenset[str], max_context: int = 1024) -> Iterator[LiveServer]:
    """serve_model on its own engine, with API keys required."""
    engine = Engine.open_sync(path, EngineOptions(max_context=max_context, max_concurrency=1))
    router = ModelRouter.serving(ServedModel("keyed", engine))

    async def open_router() -> ModelRouter:
        return router

    with _serve(open_router, api_keys=api_keys) as (url, app):
        yield LiveServer(url, router, app, engine, "keyed")


@contextlib.contextmanager
def serve_cli(argv: Sequence[str]) -> Iterator[LiveServer]:
    """The app `ninfer-serve ARGV` builds (its arguments parsed and turned into a router and an app by the CLI's own
    code, without API keys), served here instead of by the CLI's uvicorn.run."""
    from ninfer.cli.serve import _app, build_parser

    app = _app(build_parser().parse_args(list(argv)), frozenset())
    with _run_app(app) as url:
        yield LiveServer(url, app.state.router, app)


def two_models(path: Path, **settings: Any) -> dict[str, Any]:
    return {"models": {"alpha": {"path": str(path), "max_context": 1024, "aliases": ["a"]},
                       "beta": {"path": str(path), "max_context": 512, "max_concurrency": 1}},
            **settings}


@pytest.fixture(scope="session")
def qwen35_server(pytestconfig, tiny_qwen3_5) -> Iterator[LiveServer]:
    with serve_model(artifact_for(pytestconfig, tiny_qwen3_5), "tiny-qwen3.5", max_context=1024) as live:
        yield live


@pytest.fixture(scope="session")
def smollm2_server(pytestconfig, smollm2_gguf) -> Iterator[LiveServer]:
    with serve_model(artifact_for(pytestconfig, smollm2_gguf), "smollm2", max_context=2048) as live:
        yield live


# A finished request frees its lane at once, and a cancelled one within a second on an idle machine; the suite also runs
# on a loaded 2-core machine, so waits for that take this generous bound (a bound, not a delay).
SETTLE_S = 30.0


def wait_until(condition: Callable[[], bool], seconds: float = SETTLE_S,
               pause: Callable[[], None] = lambda: time.sleep(0.05)) -> bool:
    """True as soon as condition() holds, polled for up to `seconds` (a bound, not a delay); False if it never did."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        pause()
    return True


def lanes_free_within(server: LiveServer, seconds: float = SETTLE_S) -> bool:
    """True once the engine has no busy lane (decision lanes included) and nothing queued, polled for up to
    `seconds`."""
    engine = server.engine
    assert engine is not None
    return wait_until(lambda: (s := engine.stats()).busy_lanes == 0 and s.busy_decision_lanes == 0 and s.queued == 0,
                      seconds)


def idle_tokens_generated(server: LiveServer) -> int:
    """The engine's count of generated tokens, once it is idle (so that a later count is the next requests' alone)."""
    assert server.engine is not None and lanes_free_within(server), server.engine.stats()
    return server.engine.stats().tokens_generated


def cut_short(server: LiveServer, tokens_before: int, max_tokens: int) -> bool:
    """True once the lanes are free, if the engine generated fewer than `max_tokens` tokens since `idle_tokens_generated` gave
    `tokens_before`: the request was cancelled, not run to its end (`max_tokens`, for a request that does not end
    sooner by itself). A count, not a time: it holds however late a loaded machine delivers the cancellation."""
    assert server.engine is not None
    return lanes_free_within(server) and server.engine.stats().tokens_generated - tokens_before < max_tokens


RELEASE_BOUND_S = 1.0  # the issue: "a disconnect frees its lane within a second"


def disconnect_releases(server: LiveServer) -> tuple[int, int]:
    """From the server's /metrics: how many generations its clients' disconnects have cancelled so far, and how many
    of those had their lane free within RELEASE_BOUND_S of the server seeing the disconnect (the server's own
    measurement, ninfer.serve.disconnect)."""
    text = httpx.get(f"{server.url}/metrics", timeout=SETTLE_S).text
    family = next(f for f in text_string_to_metric_families(text) if f.name == "ninfer_disconnect_release_seconds")
    count = within = 0
    for sample in family.samples:
        if sample.name.endswith("_count"):
            count = int(sample.value)
        elif sample.name.endswith("_bucket") and float(sample.labels["le"]) == RELEASE_BOUND_S:
            within = int(sample.value)
    return count, within


def released_within_bound(server: LiveServer, before: tuple[int, int], departures: int = 1) -> bool:
    """True once `departures` more disconnects were released (`disconnect_releases` gave `before`), if each freed
    its lane within RELEASE_BOUND_S by the server's own clock (which starts when it sees the disconnect, so a
    client scheduled late on a loaded machine does not count against it)."""
    assert wait_until(lambda: disconnect_releases(server)[0] >= before[0] + departures), (
        f"the server reported no lane release for {departures} disconnect(s)")
    count, within = disconnect_releases(server)
    return count == before[0] + departures and within - before[1] == departures


def engine_tokens(engine: Engine, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams) -> list[int]:
    """The engine's own answer, without the server (what a request with these sampling values must reproduce)."""

    async def run() -> list[int]:
        tokens: list[int] = []
        async for event in engine.generate(Request(prompt_ids, sampling, max_new_tokens=max_tokens)):
            tokens.extend(event.token_ids)
        return tokens

    return asyncio.run(run())


def greedy_tokens(engine: Engine, prompt_ids: Sequence[int], max_tokens: int) -> list[int]:
    """The engine's own greedy answer, without the server (what a greedy request must reproduce)."""
    return engine_tokens(engine, prompt_ids, max_tokens, SamplingParams(temperature=0.0))


def greedy_answer(server: LiveServer, messages: list[dict], max_tokens: int, **render: Any) -> tuple[list[int], str]:
    """Chat messages rendered with the model's template and answered greedily by its engine: prompt ids and text."""
    assert server.engine is not None
    frontend = server.engine.frontend
    prompt = frontend.encode(frontend.render(messages, **render).text)
    return prompt, frontend.decode(greedy_tokens(server.engine, prompt, max_tokens))


def concurrently(*calls: Callable[[], Any]) -> list[Any]:
    """Runs the calls at the same time and returns their results in order. Requests that must give the same answer
    (a whole and a streamed one) cost one decode instead of two this way: the engine batches their steps, and a
    lane's tokens do not depend on its neighbours (the runtime tests check that batched equals alone)."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]
