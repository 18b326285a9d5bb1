"""The runtime on the CUDA backend: the engine runs a Model there (weights uploaded at load, a memory plan with
kv_capacity="auto"), decode passes replay as CUDA graphs equal to eager passes, lanes equal single runs, and the
plan's arithmetic refuses what does not fit with the numbers."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ninfer import errors
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(temperature=0.0)


OPTION_DEFAULTS = dict(backend="cuda", max_context=512, kv_dtype="f32", max_concurrency=3, prefill_chunk=64)


@pytest.fixture
def f32_prefill_gemm(monkeypatch):
    """For tests that compare prefill logits (the first token's logprob comes from them) tightly: against the CPU
    backend, or a prompt prefilled alone against the same prompt batched with others, where a prompt of <= 8
    tokens alone takes the decode GEMV (f32 activations) but batched takes the prefill GEMM. The prefill GEMM then
    stays on its f32 twin: its fast paths round activations to bf16 (or e4m3). Decode rows never reach the prefill
    GEMM (on device backends decode and prefill passes take turns). The fast paths' accuracy is tested in
    test_cuda_gemm.py and, end to end, in test_cuda_backend.py."""
    monkeypatch.setitem(OPTION_DEFAULTS, "cuda_gemm", "twin")


def _run(engine: Engine, prompts: list[list[int]], new_tokens: int) -> list[tuple[list[int], list[float]]]:
    """All prompts at once (as many lanes as the engine has); each one's greedy tokens and their logprobs."""

    async def one(prompt: list[int]) -> tuple[list[int], list[float]]:
        tokens: list[int] = []
        logprobs: list[float] = []
        request = Request(prompt_tokens=prompt, sampling=GREEDY, max_new_tokens=new_tokens, stop_token_ids=(),
                          logprobs=True)
        async for ev in engine.generate(request):
            tokens += ev.token_ids
            logprobs += ev.logprobs or ()
        return tokens, logprobs

    async def everything() -> list[tuple[list[int], list[float]]]:
        return list(await asyncio.gather(*(one(p) for p in prompts)))

    return asyncio.run(everything())


def _prompts(vocab: int, count: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, vocab, int(n)).tolist() for n in rng.integers(5, 90, count)]


def _options(**kw) -> EngineOptions:
    return EngineOptions(**(OPTION_DEFAULTS | kw))


@pytest.mark.usefixtures("f32_prefill_gemm")
@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_5_moe"])
def test_graph_replay_equals_eager_and_cpu(tiny_artifacts, kind):
    path = tiny_artifacts[kind]
    results = {}
    for name, options in {"graphs": _options(), "eager": _options(cuda_graphs=False),
                          "cpu": _options(backend="cpu", threads=4)}.items():
        with Engine.open_sync(path, options) as engine:
            prompts = _prompts(engine.info.vocab_size, 3)
            results[name] = _run(engine, prompts, 12)
            plan = engine.memory_plan()
            if name == "graphs":
                # 3 lanes finish at different steps only if stopped; here all run 12 tokens: batch 3 replays.
                assert plan["graphs_captured"] >= 1 and plan["graph_replays"] >= 5, plan
                assert plan["graph_bytes"] >= 0
            if name == "eager":
                assert plan["graph_replays"] == 0, plan
    # Graph replay runs the same kernels on the same data as eager passes: bit-identical logprobs.
    assert results["graphs"] == results["eager"]
    # And the GPU's greedy tokens are the CPU backend's (f32 KV, bf16 weights on both sides).
    for (gpu_tokens, gpu_lp), (cpu_tokens, cpu_lp) in zip(results["graphs"], results["cpu"], strict=True):
        assert gpu_tokens == cpu_tokens
        np.testing.assert_allclose(gpu_lp, cpu_lp, atol=2e-3)


@pytest.mark.usefixtures("f32_prefill_gemm")
def test_lanes_equal_single_runs_with_graphs(tiny_artifacts):
    path = tiny_artifacts["qwen3_5"]
    with Engine.open_sync(path, _options()) as engine:
        prompts = _prompts(engine.info.vocab_size, 3)
        together = _run(engine, prompts, 10)
    with Engine.open_sync(path, _options(max_concurrency=1)) as engine:
        alone = [_run(engine, [p], 10)[0] for p in prompts]
    for (t_tokens, t_lp), (a_tokens, a_lp) in zip(together, alone, strict=True):
        assert t_tokens == a_tokens
        np.testing.assert_allclose(t_lp, a_lp, atol=1e-4)


def test_memory_plan_auto_capacity(tiny_artifacts):
    with Engine.open_sync(tiny_artifacts["qwen3_5"], _options(kv_capacity="auto", max_context=4096)) as engine:
        plan = engine.memory_plan()
        assert plan["backend"] == "cuda"
        assert plan["weights"] > 0
        # Tiny model, big device: auto capacity is capped at max_context * lanes, in whole pages.
        assert plan["kv_capacity_tokens"] == 4096 * 3
        assert engine.stats().kv_capacity_tokens == plan["kv_capacity_tokens"]
        assert "weights" in plan["summary"] and "KV pool" in plan["summary"]


@pytest.mark.usefixtures("f32_prefill_gemm")
def test_prefill_chunk_auto_runs_a_long_prompt_in_one_pass(tiny_artifacts):
    """prefill_chunk 0 (auto) on CUDA: a tiny model on a big device gets the whole context as its chunk (capped at
    8192), the workspace is planned for that chunk plus every lane, and a 1500-token prompt prefilled in one pass
    gives the tokens and logprobs of the same prompt in 64-token chunks (f32 GEMMs; chunking changes the order of
    sums and, in the bf16 flash attention, where probabilities are rounded: the CPU comparison's bound)."""
    path = tiny_artifacts["qwen3_5"]
    with Engine.open_sync(path, _options(prefill_chunk=0, max_context=4096)) as engine:
        plan = engine.memory_plan()
        assert plan["prefill_chunk"] == 4096, plan
        assert f"{4096 + 3} rows" in plan["summary"], plan["summary"]
        prompt = np.random.default_rng(3).integers(0, engine.info.vocab_size, 1500).tolist()
        whole = _run(engine, [prompt], 8)
    with Engine.open_sync(path, _options(prefill_chunk=64, max_context=4096)) as engine:
        assert engine.memory_plan()["prefill_chunk"] == 64
        chunked = _run(engine, [prompt], 8)
    assert whole[0][0] == chunked[0][0]
    np.testing.assert_allclose(whole[0][1], chunked[0][1], atol=2e-3)
    with Engine.open_sync(path, _options(prefill_chunk=0, max_context=20000)) as engine:
        assert engine.memory_plan()["prefill_chunk"] == 8192


def test_kv_capacity_beyond_the_device_is_out_of_memory(tiny_artifacts):
    with pytest.raises(errors.OutOfMemoryError, match="KV pool"):
        Engine.open_sync(tiny_artifacts["qwen3_5"], _options(kv_capacity=1 << 40, max_context=1 << 20))
