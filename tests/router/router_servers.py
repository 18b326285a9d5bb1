"""Live router servers for the router and web UI tests (helpers; the fixtures are in conftest.py): the real app (ninfer.serve.app) over a ModelRouter whose
models are tiny random checkpoints converted to real `.ninfer` artifacts (CPU engine), run by uvicorn on a loopback
port in a background thread. Each test gets a fresh server (`router_server(config)`), since the tests change which
model is resident.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from ninfer.artifact.convert import convert
from ninfer.engine import EngineOptions
from ninfer.serve.app import create_app
from ninfer.serve.router import ModelRouter, parse_config

STARTUP_TIMEOUT_S = 30.0


@dataclass
class RouterServer:
    url: str
    router: ModelRouter
    app: Any


def artifact_for(pytestconfig: pytest.Config, src: Path) -> Path:
    folder = Path(pytestconfig.cache.mkdir("runtime-artifacts"))  # shared with the runtime and serve tests
    out = folder / f"{src.name}.bf16.ninfer"
    if not out.exists():
        convert(src, out, recipe="bf16", progress=False)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_router(config: dict[str, Any], *, webui_dir: str | None = None, port: int | None = None
                 ) -> Iterator[RouterServer]:
    parsed = parse_config(config, defaults=EngineOptions(max_context=1024, max_concurrency=2))
    holder: dict[str, ModelRouter] = {}

    async def open_router() -> ModelRouter:
        holder["router"] = ModelRouter(parsed)
        return holder["router"]

    app = create_app(open_router, webui_dir=webui_dir)
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn-router", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the router test server did not start")
        time.sleep(0.02)
    try:
        yield RouterServer(f"http://127.0.0.1:{port}", holder["router"], app)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def two_models(path: Path, **settings: Any) -> dict[str, Any]:
    return {"models": {"alpha": {"path": str(path), "max_context": 1024, "aliases": ["a"]},
                       "beta": {"path": str(path), "max_context": 512, "max_concurrency": 1}},
            **settings}
