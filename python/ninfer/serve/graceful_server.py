"""uvicorn, with SIGTERM / SIGINT running the app's graceful drain (ninfer.serve.shutdown) before uvicorn's own
shutdown: admission stops and streams end properly first, then uvicorn closes what is left. A second signal exits at
once (uvicorn's force exit)."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn

CONNECTION_CLOSE_S = 5  # uvicorn's own wait for connections, once the drain has ended every stream


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, grace_s: float) -> None:
        super().__init__(config)
        self._grace_s = grace_s
        self._draining: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def serve_app(cls, app: Any, *, host: str, port: int, log_level: str, grace_s: float) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                timeout_graceful_shutdown=CONNECTION_CLOSE_S)
        cls(config, grace_s).run()

    async def startup(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        drain = getattr(getattr(self.config.app, "state", None), "drain", None)
        if self._draining is not None or drain is None or self._loop is None:
            super().handle_exit(sig, frame)  # a second signal, or nothing to drain: uvicorn's own
            return

        async def drain_then_exit() -> None:
            await drain.run(self._grace_s)
            self.should_exit = True

        def start() -> None:
            self._draining = asyncio.ensure_future(drain_then_exit())

        # A signal handler runs between two bytecodes of whatever the loop runs: schedule, do not start, the task.
        self._draining = self._loop.create_future()  # (marks the drain as begun for a second signal)
        self._loop.call_soon_threadsafe(start)
