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


def cached_on_repeat(engine: Engine, n_prompt: int) -> int:
    """Prompt tokens the prefix cache serves to a repeat of an n-token prompt that ran before (default snapshot
    interval, nothing else cached with its beginning): a model without state reuses every whole block before the
    last token; one with Gated DeltaNet state only up to its snapshot at the prompt's last block boundary."""
    if engine.stats().prefix.total_state_slots == 0:
        return (n_prompt - 1) // 64 * 64
    last = n_prompt // 64 * 64
    return last if last < n_prompt else 0
