"""The async engine API: streaming, early exit cancels, a slow consumer stalls nobody, info / frontend, close."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from engine_helpers import collect, run_alone

from ninfer import errors
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams
from ninfer.frontend.text import TextStream


def greedy(prompt, n):
    return Request(prompt, SamplingParams(temperature=0), max_new_tokens=n, stop_token_ids=())


def test_open_is_async_and_info_describes_the_model(tiny_qwen35_artifact):
    async def main():
        engine = await Engine.open(tiny_qwen35_artifact, EngineOptions(max_context=512, max_concurrency=2))
        try:
            return engine.info, engine.stats()
        finally:
            engine.close()

    info, stats = asyncio.run(main())
    assert (info.arch, info.max_context, info.vocab_size, info.num_layers) == ("qwen3_5", 512, 248320, 8)
    assert info.modalities == ("text",) and info.artifact_bytes > 0
    # 2 chat lanes and the decision lane, a context of KV each, and 4 pages for each of the decision lane's 16 rows
    assert (stats.lanes, stats.busy_lanes, stats.decision_lanes, stats.kv_capacity_tokens) == (2, 0, 1,
                                                                                              1536 + 16 * 4 * 64)
    assert stats.resident_bytes > 0


def test_frontend_renders_and_tokenizes_with_the_artifact_resources(tiny_qwen35_artifact):
    with Engine.open_sync(tiny_qwen35_artifact, EngineOptions(max_context=256)) as engine:
        fe = engine.frontend
        rendered = fe.render([{"role": "user", "content": "Hi"}], enable_thinking=False)
        assert rendered.text.startswith("<|im_start|>user\nHi<|im_end|>") and not rendered.starts_in_reasoning
        assert fe.render([{"role": "user", "content": "Hi"}]).starts_in_reasoning
        assert fe.encode("Hello <|im_start|>user") == [9419, 220, 248045, 846]
        assert 248046 in fe.eos_token_ids
        stream = TextStream(fe)
        ids = fe.encode("naïve café ☕")
        assert "".join(stream.push([t]) for t in ids) == "naïve café ☕"


def test_leaving_the_stream_early_cancels_and_frees(tiny_llama_artifact):
    rng = np.random.default_rng()
    with Engine.open_sync(tiny_llama_artifact, EngineOptions(max_context=512, max_concurrency=2)) as engine:
        prompt = rng.integers(3, 500, size=20).tolist()

        async def main():
            got = []
            async for ev in engine.generate(greedy(prompt, 400)):
                got.extend(ev.token_ids)
                if len(got) >= 3:
                    break
            return got

        asyncio.run(main())
        deadline = asyncio.run(_wait_idle(engine))
        assert deadline
        s = engine.stats()
        assert (s.busy_lanes, s.kv_free_tokens) == (0, s.kv_capacity_tokens)


def test_on_cancel_freed_reports_when_a_left_request_s_lane_is_free(tiny_llama_artifact):
    """Called once, on the pump thread, for a stream left early (running or queued), with the time its final event
    (lane and KV free) arrived; never for a stream read to its end. The server times disconnects with it
    (ninfer_disconnect_release_seconds)."""
    rng = np.random.default_rng()
    with Engine.open_sync(tiny_llama_artifact, EngineOptions(max_context=512, max_concurrency=1)) as engine:
        prompts = [rng.integers(3, 500, size=20).tolist() for _ in range(3)]
        reports: dict[str, list[float]] = {"running": [], "queued": [], "finished": []}

        def report(name):
            return reports[name].append

        async def main():
            events = {name: engine.generate(greedy(p, 400), on_cancel_freed=report(name))
                      for name, p in (("running", prompts[0]), ("queued", prompts[1]))}
            await anext(events["running"])  # it holds the one lane; "queued" waits behind it
            waiting = asyncio.ensure_future(anext(events["queued"]))
            await asyncio.sleep(0)  # one loop turn: submitted
            queued = engine.stats().queued
            waiting.cancel()  # the reader of the queued stream leaves
            await asyncio.gather(waiting, return_exceptions=True)
            left_at = time.perf_counter()
            await events["running"].aclose()
            async for _ in engine.generate(greedy(prompts[2], 5), on_cancel_freed=report("finished")):
                pass
            return queued, left_at

        queued, left_at = asyncio.run(main())
        assert queued == 1
        assert asyncio.run(_wait_idle(engine))
        assert [len(reports[k]) for k in ("running", "queued", "finished")] == [1, 1, 0]
        assert reports["running"][0] > left_at


async def _wait_idle(engine: Engine) -> bool:
    for _ in range(2000):
        s = engine.stats()
        if s.busy_lanes == 0 and s.queued == 0:
            return True
        await asyncio.sleep(0.001)
    return False


def test_a_slow_consumer_does_not_stall_another(tiny_llama_artifact):
    rng = np.random.default_rng()
    with Engine.open_sync(tiny_llama_artifact, EngineOptions(max_context=512, max_concurrency=2)) as engine:
        fast_req = greedy(rng.integers(3, 500, size=10).tolist(), 60)
        slow_req = greedy(rng.integers(3, 500, size=10).tolist(), 60)
        fast_alone, slow_alone = run_alone(engine, [fast_req, slow_req])

        async def main():
            slow_tokens = []
            fast_task = asyncio.ensure_future(collect(engine, fast_req))
            async for ev in engine.generate(slow_req):
                slow_tokens.extend(ev.token_ids)
                if not fast_task.done():
                    await asyncio.sleep(0.05)  # a consumer that reads slowly
            return (await fast_task)[0], slow_tokens, fast_task

        fast, slow, _ = asyncio.run(main())
        assert fast == fast_alone and slow == slow_alone


def test_close_ends_pending_requests_and_refuses_new_ones(tiny_llama_artifact):
    engine = Engine.open_sync(tiny_llama_artifact, EngineOptions(max_context=2048, max_concurrency=1))

    async def main():
        task = asyncio.ensure_future(collect(engine, greedy([5] * 10, 1500)))
        queued = asyncio.ensure_future(collect(engine, greedy([6] * 10, 10)))
        await asyncio.sleep(0.05)
        await asyncio.to_thread(engine.close)
        return await task, await queued

    (running_tokens, running_last), (queued_tokens, queued_last) = asyncio.run(main())
    assert running_last.finish_reason == "cancelled" and len(running_tokens) < 1500
    assert queued_last.finish_reason == "cancelled" and queued_tokens == []
    with pytest.raises(errors.EngineError, match="closed"):
        engine.score_sync([1, 2, 3])
    engine.close()  # idempotent
