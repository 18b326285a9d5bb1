"""Lanes, chunked prefill interleaved with batched decode, admission, cancellation and scoring, on the real CPU
engine with tiny random models (plain llama: KV pages only; Qwen3.5: KV pages and per-lane Gated DeltaNet state)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch
from engine_helpers import cached_on_repeat, collect, run_alone, run_together
from ninfer import errors
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams
from tiny_models import load_reference_model

MODELS = ["tiny_llama_artifact", "tiny_qwen35_artifact"]


@pytest.fixture(params=MODELS)
def artifact(request):
    return request.getfixturevalue(request.param)


def random_prompt(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return rng.integers(3, min(vocab, 50000), size=n).tolist()


def mixed_requests(rng: np.random.Generator, vocab: int) -> list[Request]:
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=int(rng.integers(1 << 40)))
    return [
        Request(random_prompt(rng, 5, vocab), SamplingParams(temperature=0), max_new_tokens=20, stop_token_ids=()),
        Request(random_prompt(rng, 70, vocab), seeded, max_new_tokens=12, stop_token_ids=()),
        Request(random_prompt(rng, 150, vocab), SamplingParams(temperature=0), max_new_tokens=25, stop_token_ids=()),
        Request(random_prompt(rng, 200, vocab), SamplingParams(temperature=1.1, top_k=20, seed=7),
                max_new_tokens=16, stop_token_ids=()),
    ]


def open_engine(path, **options) -> Engine:
    defaults = dict(max_context=1024, max_concurrency=4, prefill_chunk=64, max_queue=8)
    return Engine.open_sync(path, EngineOptions(**{**defaults, **options}))


def test_concurrent_requests_give_the_tokens_each_gives_alone(artifact):
    rng = np.random.default_rng()
    with open_engine(artifact) as engine:
        requests = mixed_requests(rng, engine.info.vocab_size)
        alone = run_alone(engine, requests)
        together = run_together(engine, requests)
        assert [t for t, _ in together] == alone
        for (tokens, last), req in zip(together, requests):
            assert last.finish_reason == "length"
            assert last.usage.generated_tokens == len(tokens) == req.max_new_tokens
            n = len(req.prompt_tokens)
            assert last.usage.prompt_tokens == n and last.usage.cached_tokens == cached_on_repeat(engine, n)
            assert last.timings.ttft_s > 0 and last.timings.decode_tokens_per_s > 0


def test_request_admitted_mid_decode_changes_nothing(artifact):
    rng = np.random.default_rng()
    with open_engine(artifact) as engine:
        vocab = engine.info.vocab_size
        first = [Request(random_prompt(rng, 30, vocab), SamplingParams(temperature=0), max_new_tokens=40,
                         stop_token_ids=()),
                 Request(random_prompt(rng, 90, vocab), SamplingParams(temperature=0.8, seed=3), max_new_tokens=40,
                         stop_token_ids=())]
        late = Request(random_prompt(rng, 300, vocab), SamplingParams(temperature=0), max_new_tokens=10,
                       stop_token_ids=())
        alone = run_alone(engine, [*first, late])

        async def main():
            before = engine.stats().tokens_generated  # a running count: the solo runs above made tokens too
            tasks = [asyncio.ensure_future(collect(engine, r)) for r in first]
            while engine.stats().tokens_generated < before + 5:  # both are decoding
                await asyncio.sleep(0.001)
            late_result = await collect(engine, late)
            return [(await t)[0] for t in tasks] + [late_result[0]]

        assert asyncio.run(main()) == alone


def wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.0005)


def test_cancel_mid_prefill_and_mid_decode_frees_lane_and_kv(tiny_qwen35_artifact):
    rng = np.random.default_rng()
    with open_engine(tiny_qwen35_artifact, max_context=4096) as engine:
        vocab = engine.info.vocab_size
        other = Request(random_prompt(rng, 40, vocab), SamplingParams(temperature=0), max_new_tokens=60,
                        stop_token_ids=())
        (other_alone,) = run_alone(engine, [other])
        capacity = engine.stats().kv_capacity_tokens
        assert engine.stats().kv_free_tokens == capacity

        async def main():
            other_task = asyncio.ensure_future(collect(engine, other))
            # Mid-prefill: a long prompt, cancelled once some of it is in the cache but before its first token.
            long = engine.submit(Request(random_prompt(rng, 3000, vocab), max_new_tokens=5))
            before = engine.stats().tokens_prefilled
            while engine.stats().tokens_prefilled < before + 200:
                await asyncio.sleep(0.0002)
            assert engine.cancel(long.request_id)
            ev = await anext(long)
            assert (ev.finish_reason, ev.usage.generated_tokens) == ("cancelled", 0)
            mid_prefill = engine.stats()
            # Mid-decode: cancelled after 3 tokens.
            decode = engine.submit(Request(random_prompt(rng, 20, vocab), max_new_tokens=500, stop_token_ids=()))
            seen = 0
            while seen < 3:
                seen += len((await anext(decode)).token_ids)
            assert engine.cancel(decode.request_id)
            while (ev := await anext(decode)).finish_reason is None:
                pass
            assert ev.finish_reason == "cancelled" and 3 <= ev.usage.generated_tokens < 500
            mid_decode = engine.stats()
            return mid_prefill, mid_decode, (await other_task)[0]

        mid_prefill, mid_decode, other_tokens = asyncio.run(main())
        # Only `other` can still hold a lane; its reservation is 100 tokens = 2 pages.
        for s in (mid_prefill, mid_decode):
            assert s.busy_lanes <= 1 and s.queued == 0
            assert s.kv_free_tokens >= capacity - 128
        assert other_tokens == other_alone
        final = engine.stats()
        # Free: unused, or holding only prefix-cache contents (what a new request may take).
        assert (final.busy_lanes, final.kv_free_tokens, final.free_state_slots) == (
            0, capacity, final.prefix.total_state_slots)
        assert engine.cancel(10**9) is False


def test_admission_busy_capacity_and_invalid_values(tiny_llama_artifact):
    rng = np.random.default_rng()
    with open_engine(tiny_llama_artifact, max_context=512, max_concurrency=2, max_queue=2,
                     kv_capacity=384) as engine:
        vocab = engine.info.vocab_size
        # Long enough that no lane frees up while the six submits below run (they hold 2 x 130 of the 384 KV tokens).
        ok = Request(random_prompt(rng, 10, vocab), SamplingParams(temperature=0), max_new_tokens=120,
                     stop_token_ids=())
        (ok_alone,) = run_alone(engine, [ok])

        async def flood():
            streams, busy = [], 0
            for _ in range(6):
                try:
                    streams.append(engine.submit(ok))
                except errors.EngineBusyError as exc:
                    assert "2 lanes and 2 queue places" in str(exc)
                    busy += 1
            outputs = []
            for stream in streams:
                outputs.append([t async for ev in stream for t in ev.token_ids])
            return busy, outputs

        busy, outputs = asyncio.run(flood())
        assert busy == 2 and outputs == [ok_alone] * 4

        with pytest.raises(errors.CapacityError, match="the prompt has 513 tokens; max_context is 512"):
            run_alone(engine, [Request(random_prompt(rng, 513, vocab))])
        with pytest.raises(errors.CapacityError, match=r"needs 400 KV tokens \(prompt 300 \+ max_new_tokens 100, "
                                                       r"capped at max_context 512.*holds 384"):
            run_alone(engine, [Request(random_prompt(rng, 300, vocab), max_new_tokens=100)])
        with pytest.raises(errors.EngineError, match="top_p = 0"):
            run_alone(engine, [Request([5, 6], SamplingParams(top_p=0.0))])
        with pytest.raises(errors.EngineError, match="seed"):
            run_alone(engine, [Request([5, 6], SamplingParams(seed=-1))])
        with pytest.raises(errors.EngineError, match=f"token id {vocab} at position 1 is outside the vocabulary"):
            run_alone(engine, [Request([5, vocab])])
        with pytest.raises(errors.EngineError, match="max_new_tokens = 0"):
            run_alone(engine, [Request([5, 6], max_new_tokens=0)])
        # A reservation that fits the pool but not now waits in the queue, then runs.
        big = Request(random_prompt(rng, 200, vocab), SamplingParams(temperature=0), max_new_tokens=150,
                      stop_token_ids=())
        results = run_together(engine, [big, big])
        assert results[0][0] == results[1][0] and results[1][1].timings.queue_s > 0
        assert run_alone(engine, [ok]) == [ok_alone]


@pytest.mark.parametrize("options", [dict(max_concurrency=9), dict(prefill_chunk=100), dict(max_context=0),
                                     dict(cuda_gemm="fast"), dict(decoding_prefill_chunk=100),
                                     dict(decoding_prefill_chunk=512, prefill_chunk=256)])
def test_invalid_engine_options_name_the_option(tiny_llama_artifact, options):
    name = next(iter(options))
    with pytest.raises(errors.EngineError, match=f"invalid engine option: {name} = "):
        Engine.open_sync(tiny_llama_artifact, EngineOptions(**options))


@pytest.mark.parametrize("choice", ["auto", "twin", "streamed"])
def test_every_cuda_gemm_choice_is_accepted_and_the_cpu_answers_alike(tiny_llama_artifact, choice):
    """cuda_gemm picks the device's prefill GEMM; the CPU backend takes every valid choice and ignores it."""
    prompt = Request([5, 6, 7, 8], SamplingParams(temperature=0), max_new_tokens=6, stop_token_ids=())
    with open_engine(tiny_llama_artifact, backend="cpu") as engine:
        want = run_alone(engine, [prompt])
    with open_engine(tiny_llama_artifact, backend="cpu", cuda_gemm=choice) as engine:
        assert run_alone(engine, [prompt]) == want


def test_prefill_chunk_auto_is_512_on_the_cpu(tiny_llama_artifact):
    """prefill_chunk 0 (the default) resolves to 512 on the CPU backend; only device backends plan a larger one."""
    with Engine.open_sync(tiny_llama_artifact, EngineOptions(backend="cpu", max_context=4096)) as engine:
        assert engine.memory_plan()["prefill_chunk"] == 512
    with open_engine(tiny_llama_artifact, backend="cpu", prefill_chunk=192) as engine:
        assert engine.memory_plan()["prefill_chunk"] == 192


def test_a_prompt_arriving_while_another_lane_decodes_runs_in_decoding_chunks(artifact):
    """A prompt admitted while a lane decodes is prefilled in decoding_prefill_chunk pieces (its progress events say
    so), in prefill_chunk pieces once it is alone; and both requests give exactly the tokens and logprobs they give
    alone (the CPU backend's results do not depend on where a prompt is cut at multiples of 64)."""
    rng = np.random.default_rng()
    with open_engine(artifact, max_concurrency=2, prefill_chunk=256, decoding_prefill_chunk=64,
                     prefix_cache=False) as engine:  # (the runs alone compute again what the first ones did)
        assert (engine.memory_plan()["prefill_chunk"], engine.memory_plan()["decoding_prefill_chunk"]) == (256, 64)
        vocab = engine.info.vocab_size
        decoding = Request(random_prompt(rng, 9, vocab), SamplingParams(temperature=0), max_new_tokens=120,
                           stop_token_ids=(), logprobs=True)
        arriving = Request(random_prompt(rng, 600, vocab), SamplingParams(temperature=0), max_new_tokens=4,
                           stop_token_ids=(), logprobs=True, report_progress=True)

        async def events(request):
            return [ev async for ev in engine.generate(request)]

        async def arrive_mid_decode():
            stream = engine.generate(decoding)
            first = [await anext(stream)]  # the decoding lane has its first token: it decodes from here on
            later = asyncio.create_task(events(arriving))
            return first + [ev async for ev in stream], await later

        decoded, arrived = asyncio.run(arrive_mid_decode())
        alone = [asyncio.run(events(r)) for r in (decoding, arriving)]
    processed = [ev.progress.processed for ev in arrived if ev.progress is not None]
    # The decoding lane runs its 120 tokens past the arrival's prefill: every chunk is 64 tokens.
    assert processed == [min(64 * (i + 1), 600) for i in range(len(processed))] and processed[-1] == 600
    assert [ev.progress.processed for ev in alone[1] if ev.progress is not None] == [256, 512, 600]

    def tokens_and_logprobs(evs):
        return [(ev.token_ids, ev.logprobs) for ev in evs if ev.token_ids]

    assert tokens_and_logprobs(decoded) == tokens_and_logprobs(alone[0])
    assert tokens_and_logprobs(arrived) == tokens_and_logprobs(alone[1])


def test_score_matches_hf_log_softmax_up_to_the_full_context(tiny_llama_artifact, tiny_llama):
    rng = np.random.default_rng()
    reference = load_reference_model(tiny_llama)
    # f32 KV: the comparison is of the scoring path itself; bf16 KV rounding (checked elsewhere) would blur it.
    with open_engine(tiny_llama_artifact, max_context=300, prefill_chunk=128, kv_capacity=600,
                     kv_dtype="f32") as engine:
        tokens = random_prompt(rng, 300, engine.info.vocab_size)
        got = np.array(engine.score_sync(tokens))
        stats = engine.stats()
        assert (stats.busy_lanes, stats.kv_free_tokens) == (0, stats.kv_capacity_tokens)
    with torch.no_grad():
        logits = reference(torch.tensor([tokens])).logits[0].double()
    want = torch.log_softmax(logits, -1)[torch.arange(299), torch.tensor(tokens[1:])].numpy()
    assert got.shape == (299,)
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_generated_logprobs_agree_with_scoring(artifact):
    rng = np.random.default_rng()
    with open_engine(artifact) as engine:
        prompt = random_prompt(rng, 50, engine.info.vocab_size)
        request = Request(prompt, SamplingParams(temperature=0), max_new_tokens=10, stop_token_ids=(),
                          logprobs=True, top_logprobs=3)

        async def main():
            return [ev async for ev in engine.generate(request)]

        events = asyncio.run(main())
        tokens = [t for ev in events for t in ev.token_ids]
        logprobs = [lp for ev in events if ev.logprobs for lp in ev.logprobs]
        tops = [alts for ev in events if ev.top_logprobs for alts in ev.top_logprobs]
        scored = engine.score_sync(prompt + tokens)[-len(tokens):]
    np.testing.assert_allclose(logprobs, scored, atol=2e-3)
    for token, lp, alts in zip(tokens, logprobs, tops):
        assert len(alts) == 3 and alts[0][0] == token and alts[0][1] == pytest.approx(lp)  # greedy = top-1
        assert alts[0][1] >= alts[1][1] >= alts[2][1]


def test_stop_tokens_end_generation_without_emitting_them(tiny_llama_artifact):
    rng = np.random.default_rng()
    with open_engine(tiny_llama_artifact) as engine:
        prompt = random_prompt(rng, 12, engine.info.vocab_size)
        (free,) = run_alone(engine, [Request(prompt, SamplingParams(temperature=0), max_new_tokens=12,
                                             stop_token_ids=())])
        stop = free[5]
        first = free.index(stop)
        tokens, last = asyncio.run(collect(engine, Request(prompt, SamplingParams(temperature=0), max_new_tokens=12,
                                                           stop_token_ids=(stop,))))
        assert tokens == free[:first] and last.finish_reason == "stop"
        assert last.usage.generated_tokens == first + 1
