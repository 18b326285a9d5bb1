"""Prefill progress events on the CUDA backend, where decode passes and prefill chunks take turns and tokens are
sampled on the device: still one event per chunk of the reporting request, all before its first token, and its
tokens are those it gives without reporting."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prefill_progress import check_progress

from ninfer.engine import Engine, EngineOptions, GenerationEvent, Request, SamplingParams

pytestmark = pytest.mark.gpu

CHUNK = 64


async def _events(engine: Engine, request: Request) -> list[GenerationEvent]:
    return [ev async for ev in engine.generate(request)]


def test_progress_per_chunk_while_another_lane_decodes(tiny_artifacts):
    # "twin": the prefill GEMM's f32 path, so that a prompt's tokens do not depend on what shares its passes.
    options = EngineOptions(backend="cuda", max_context=1024, max_concurrency=2, prefill_chunk=CHUNK,
                            cuda_gemm="twin")
    rng = np.random.default_rng()
    with Engine.open_sync(tiny_artifacts["qwen3_5"], options) as engine:
        vocab = engine.info.vocab_size
        decoding = Request(rng.integers(0, vocab, 7).tolist(), SamplingParams(temperature=0), max_new_tokens=200,
                           stop_token_ids=())
        long_prompt = rng.integers(0, vocab, 5 * CHUNK + 9).tolist()

        def greedy(report_progress: bool) -> Request:
            return Request(long_prompt, SamplingParams(temperature=0), max_new_tokens=6, stop_token_ids=(),
                           report_progress=report_progress)

        async def side_by_side():
            first = asyncio.ensure_future(_events(engine, decoding))
            while engine.stats().tokens_generated < 2:  # the short request is decoding
                await asyncio.sleep(0.001)
            reporting = await _events(engine, greedy(True))
            return reporting, await first

        reporting, decoded = asyncio.run(side_by_side())
        alone = asyncio.run(_events(engine, greedy(False)))
    check_progress(reporting, len(long_prompt), CHUNK)
    assert all(ev.progress is None for ev in decoded + alone)
    assert [t for ev in reporting for t in ev.token_ids] == [t for ev in alone for t in ev.token_ids]
