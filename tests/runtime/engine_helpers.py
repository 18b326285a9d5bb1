"""Small helpers the runtime tests share: run requests to the end and collect their tokens and final event."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ninfer.engine import Engine, GenerationEvent, Request


async def collect(engine: Engine, request: Request) -> tuple[list[int], GenerationEvent]:
    tokens: list[int] = []
    last = None
    async for ev in engine.generate(request):
        tokens.extend(ev.token_ids)
        last = ev
    return tokens, last


def run_together(engine: Engine, requests: Sequence[Request]) -> list[tuple[list[int], GenerationEvent]]:
    async def main():
        return await asyncio.gather(*(collect(engine, r) for r in requests))

    return asyncio.run(main())


def run_alone(engine: Engine, requests: Sequence[Request]) -> list[list[int]]:
    return [asyncio.run(collect(engine, r))[0] for r in requests]
