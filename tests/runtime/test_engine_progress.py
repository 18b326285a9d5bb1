"""Prefill progress events (Request.report_progress) on the real CPU engine: one per prefill chunk, all before the
first token, and none for a request that did not ask."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from engine_helpers import cached_on_repeat
from prefill_progress import check_progress

from ninfer.engine import Engine, EngineOptions, GenerationEvent, Request, SamplingParams

CHUNK = 64


def open_engine(path) -> Engine:
    return Engine.open_sync(path, EngineOptions(max_context=1024, max_concurrency=2, prefill_chunk=CHUNK))


async def events_of(engine: Engine, request: Request) -> list[GenerationEvent]:
    return [ev async for ev in engine.generate(request)]


def greedy(prompt: list[int], *, report_progress: bool) -> Request:
    return Request(prompt, SamplingParams(temperature=0), max_new_tokens=3, stop_token_ids=(),
                   report_progress=report_progress)


@pytest.mark.parametrize("n_prompt", [1, CHUNK, CHUNK + 1, 3 * CHUNK + 17])
def test_one_progress_event_per_prefill_chunk_before_the_first_token(tiny_llama_artifact, n_prompt):
    rng = np.random.default_rng()
    with open_engine(tiny_llama_artifact) as engine:
        prompt = rng.integers(3, engine.info.vocab_size, size=n_prompt).tolist()
        with_progress = asyncio.run(events_of(engine, greedy(prompt, report_progress=True)))
        without = asyncio.run(events_of(engine, greedy(prompt, report_progress=False)))
        repeat_cached = cached_on_repeat(engine, n_prompt)  # the second run reuses the first's prefix
    check_progress(with_progress, n_prompt, CHUNK)
    assert all(ev.progress is None for ev in without)
    # Reporting changes nothing else: the same tokens, the same usage.
    assert with_progress[-1].finish_reason == "length"
    assert [ev.token_ids for ev in with_progress if ev.progress is None] == [ev.token_ids for ev in without]
    first, repeat = with_progress[-1].usage, without[-1].usage
    assert (first.prompt_tokens, first.generated_tokens, first.cached_tokens) == (
        repeat.prompt_tokens, repeat.generated_tokens, 0)
    assert repeat.cached_tokens == repeat_cached


def test_progress_only_for_the_request_that_asked_when_prefills_share_steps(tiny_qwen35_artifact):
    """Two prompts prefilled side by side (their chunks share steps as the prefill budget allows): each chunk of the
    reporting one is reported once, the other gets no progress event."""
    rng = np.random.default_rng()
    with open_engine(tiny_qwen35_artifact) as engine:
        vocab = min(engine.info.vocab_size, 50000)
        prompts = [rng.integers(3, vocab, size=n).tolist() for n in (150, 130)]

        async def both():
            return await asyncio.gather(events_of(engine, greedy(prompts[0], report_progress=True)),
                                        events_of(engine, greedy(prompts[1], report_progress=False)))

        reporting, silent = asyncio.run(both())
    check_progress(reporting, len(prompts[0]), CHUNK)
    assert all(ev.progress is None for ev in silent) and silent[-1].finish_reason == "length"
