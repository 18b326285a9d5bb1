"""Live servers for the Responses and Anthropic tests: the real app (ninfer.serve.app) on the real CPU engine, run by
uvicorn on a loopback port in a background thread, one per model for the whole session.

- `qwen35_server`: the tiny random Qwen3.5 checkpoint (real 248k tokenizer and chat template; thinking on by default,
  so every answer starts as reasoning). Its text is noise, which is fine for checking shapes and consistency.
- `smollm2_server`: SmolLM2-135M-Instruct (bf16), a real model that answers, stops by itself, and copies a few-shot
  tool-call pattern under greedy decoding.

Bind the fixtures in a test module: `qwen35_server = protocol_servers.qwen35_server`.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from ninfer.artifact.convert import convert
from ninfer.engine import Engine, EngineOptions
from ninfer.serve.app import create_app
from ninfer.serve.state import ModelRouter, ServedModel

STARTUP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class LiveServer:
    url: str  # http://127.0.0.1:PORT
    engine: Engine
    model_id: str


def _artifact(pytestconfig: pytest.Config, src: Path) -> Path:
    folder = Path(pytestconfig.cache.mkdir("runtime-artifacts"))  # shared with the runtime tests' artifacts
    out = folder / f"{src.name}.bf16.ninfer"
    if not out.exists():
        convert(src, out, recipe="bf16", progress=False)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(path: Path, model_id: str, max_context: int) -> Iterator[LiveServer]:
    engine = Engine.open_sync(path, EngineOptions(max_context=max_context, max_concurrency=2))
    router = ModelRouter(ServedModel(model_id, engine))

    async def open_router() -> ModelRouter:
        return router

    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(open_router), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name=f"uvicorn-{model_id}", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the test server for {model_id} did not start")
        time.sleep(0.05)
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", engine, model_id)
    finally:
        server.should_exit = True
        thread.join(timeout=30)  # the lifespan closes the engine


@pytest.fixture(scope="session")
def qwen35_server(pytestconfig, tiny_qwen3_5) -> Iterator[LiveServer]:
    yield from _serve(_artifact(pytestconfig, tiny_qwen3_5), "tiny-qwen3.5", max_context=1024)


@pytest.fixture(scope="session")
def smollm2_server(pytestconfig, smollm2_gguf) -> Iterator[LiveServer]:
    yield from _serve(_artifact(pytestconfig, smollm2_gguf), "smollm2", max_context=2048)


def lanes_free_within(server: LiveServer, seconds: float) -> bool:
    """True once the engine has no busy lane and nothing queued, polled for up to `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stats = server.engine.stats()
        if stats.busy_lanes == 0 and stats.queued == 0:
            return True
        time.sleep(0.01)
    return False
