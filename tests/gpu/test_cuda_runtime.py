"""The runtime on the CUDA backend: the engine runs a Model there (weights uploaded at load, a memory plan with
kv_capacity="auto"), decode passes replay as CUDA graphs equal to eager passes, lanes equal single runs, and the
plan's arithmetic refuses what does not fit with the numbers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

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
                # Lanes start decoding at different steps (prompts of one or two chunks), so batch sizes 1..3 each
                # take a warm-up and a capture; the rest are replays.
                assert plan["graphs_captured"] >= 1 and plan["graph_captures"] >= 1, plan
                assert plan["graph_captures"] + plan["graph_replays"] >= 5 and plan["graph_replays"] >= 1, plan
                assert plan["graph_bytes"] >= 0
            if name == "eager":
                assert plan["graph_replays"] == 0, plan
    # Graph replay runs the same kernels on the same data as eager passes: bit-identical logprobs.
    assert results["graphs"] == results["eager"]
    # And the GPU's greedy tokens are the CPU backend's (f32 KV, bf16 weights on both sides).
    for (gpu_tokens, gpu_lp), (cpu_tokens, cpu_lp) in zip(results["graphs"], results["cpu"], strict=True):
        assert gpu_tokens == cpu_tokens
        np.testing.assert_allclose(gpu_lp, cpu_lp, atol=2e-3)


# One process's greedy run of three prompts (graphs, then eager), printed as JSON: chained launches are chosen once
# per process (NINFER_CUDA_CHAINED), so each arm runs in its own.
CHAINED_RUN = """
import asyncio, json, sys
import numpy as np
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams

async def run(engine, prompts):
    async def one(prompt):
        tokens, logprobs = [], []
        request = Request(prompt_tokens=prompt, sampling=SamplingParams(temperature=0.0), max_new_tokens=24,
                          stop_token_ids=(), logprobs=True)
        async for ev in engine.generate(request):
            tokens += ev.token_ids
            logprobs += ev.logprobs or ()
        return tokens, logprobs
    return await asyncio.gather(*(one(p) for p in prompts))

results = []
for graphs in (True, False):
    options = EngineOptions(backend="cuda", max_context=512, kv_dtype="bf16", max_concurrency=3, prefill_chunk=64,
                            cuda_graphs=graphs)
    with Engine.open_sync(sys.argv[1], options) as engine:
        rng = np.random.default_rng(3)
        prompts = [rng.integers(0, engine.info.vocab_size, int(n)).tolist() for n in (7, 70, 130)]
        results.append(asyncio.run(run(engine, prompts)))
print(json.dumps(results))
"""


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_5_moe"])
def test_chained_launches_change_no_result(tiny_artifacts, kind):
    """Kernels launched chained (common.cuh: each may be scheduled while the previous one runs, and waits for it
    first) give bit for bit what plain launches give, with graphs and eagerly: a kernel that read or wrote before
    its wait would show here as differing logprobs."""
    arms = {}
    for chained in ("1", "0"):
        done = subprocess.run([sys.executable, "-c", CHAINED_RUN, str(tiny_artifacts[kind])], capture_output=True,
                              text=True, env=os.environ | {"NINFER_CUDA_CHAINED": chained}, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        arms[chained] = json.loads(done.stdout.strip().splitlines()[-1])
    assert arms["1"] == arms["0"]


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


def _run_staggered(engine: Engine, prompts: list[list[int]], new_tokens: list[int],
                   stop_after: dict[int, int] | None = None) -> list[tuple[list[int], list[float]]]:
    """Like _run, with each prompt's own token budget (lanes leave at different steps, and waiting prompts join
    as they do: the decode batch size changes between steps). A prompt in `stop_after` has its request cancelled
    once it has that many tokens (the loop leaves early)."""
    stop_after = stop_after or {}

    async def one(i: int) -> tuple[list[int], list[float]]:
        tokens: list[int] = []
        logprobs: list[float] = []
        request = Request(prompt_tokens=prompts[i], sampling=GREEDY, max_new_tokens=new_tokens[i],
                          stop_token_ids=(), logprobs=True)
        async for ev in engine.generate(request):
            tokens += ev.token_ids
            logprobs += ev.logprobs or ()
            if i in stop_after and len(tokens) >= stop_after[i]:
                break
        return tokens, logprobs

    async def everything() -> list[tuple[list[int], list[float]]]:
        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))

    return asyncio.run(everything())


def _graph_counts(engine: Engine) -> dict[str, float]:
    plan = engine.memory_plan()
    return {k: plan[k] for k in ("graph_captures", "graph_replays", "graph_capture_host_us", "graph_replay_host_us")}


# Prompt lengths next to page boundaries (64 tokens a page) and token budgets that carry contexts across several
# more: the replayed graphs' page tables grow while their addresses stay.
BOUNDARY_PROMPTS = [60, 3, 127, 64, 90]
BOUNDARY_BUDGETS = [70, 40, 75, 30, 20]


@pytest.mark.usefixtures("f32_prefill_gemm")
@pytest.mark.parametrize(("kind", "kv_dtype"), [("qwen3_5", "f32"), ("qwen3_5", "bf16"), ("qwen3_5", "fp8"),
                                                ("qwen3_5", "int8"), ("qwen3_5", "nvfp4"), ("qwen3_5", "k8v4"),
                                                ("qwen3_5_moe", "bf16")])
def test_graph_replays_across_pages_and_batch_changes_equal_eager(tiny_artifacts, kind, kv_dtype):
    """Decode graphs captured once per batch size and replayed with new step tables: lanes joining and leaving
    (batch 3 -> 2 -> 3 -> ...), contexts growing across page boundaries. Every lane's tokens are the eager run's;
    logprobs agree to 5e-4 (a lane admitted one step earlier or later in one of the runs, which host timing decides,
    meets other batch sizes, and the split-KV decode kernel's split count follows the batch size, so it sums the
    same row in another order: session 6 saw 1.9e-4 on bf16 KV in 2 of 3 runs; test_graph_replay_equals_eager_and_cpu
    checks bit equality at a fixed batch). bf16 / fp8 / int8 KV take the split-KV decode kernel, whose split count no longer follows the
    context (int8 and fp8 also read per-row scales from the pages the replay's page table names); the MoE model
    routes on the device inside the graph (its grouped matmul's buckets come from this step's router logits)."""
    path = tiny_artifacts[kind]
    results, counts = {}, {}
    for name, graphs in (("graphs", True), ("eager", False)):
        with Engine.open_sync(path, _options(kv_dtype=kv_dtype, cuda_graphs=graphs)) as engine:
            vocab = engine.info.vocab_size
            prompts = [np.random.default_rng(n).integers(0, vocab, n).tolist() for n in BOUNDARY_PROMPTS]
            results[name] = _run_staggered(engine, prompts, BOUNDARY_BUDGETS)
            counts[name] = _graph_counts(engine)
    for (g_tokens, g_lp), (e_tokens, e_lp), budget in zip(results["graphs"], results["eager"], BOUNDARY_BUDGETS,
                                                           strict=True):
        assert len(g_tokens) == budget
        assert g_tokens == e_tokens
        np.testing.assert_allclose(g_lp, e_lp, atol=5e-4)
    g, e = counts["graphs"], counts["eager"]
    assert e["graph_replays"] == 0 and e["graph_captures"] == 0, e
    # ~95 decode passes: most are replays; captures happen once per batch size (again only after a buffer grew).
    assert g["graph_replays"] >= 50 and g["graph_captures"] <= g["graph_replays"] / 4, g


@pytest.mark.usefixtures("f32_prefill_gemm")
def test_op_timing_leaves_graph_replays_as_they_are(tiny_artifacts):
    """With the op-timing backend (cuda_op_times), ops of captured and replayed passes record no events (those
    passes are timed as a whole; an event left in a capture would fail the next collection): the same tokens and
    logprobs as the untimed engine (to 1e-4 absolute or relative: the timed engine's events and syncs let lanes join a
    step apart, so rows meet other batch sizes, see the test above; logprobs near -10 differed by 1.9e-4), graphs replayed,
    and the eager passes' ops timed."""
    path = tiny_artifacts["qwen3_5"]
    results, plans = {}, {}
    for timed in (False, True):
        with Engine.open_sync(path, _options(kv_dtype="bf16", cuda_op_times=timed)) as engine:
            vocab = engine.info.vocab_size
            prompts = [np.random.default_rng(n).integers(0, vocab, n).tolist() for n in BOUNDARY_PROMPTS]
            results[timed] = _run_staggered(engine, prompts, [b // 2 for b in BOUNDARY_BUDGETS])
            plans[timed] = engine.memory_plan()
    for (t_tokens, t_lp), (u_tokens, u_lp) in zip(results[True], results[False], strict=True):
        assert t_tokens == u_tokens
        np.testing.assert_allclose(t_lp, u_lp, rtol=1e-4, atol=1e-4)
    timed, untimed = plans[True], plans[False]
    assert timed["graph_replays"] >= 20 and timed["graph_captures"] >= 1, timed
    assert untimed["op_times"] == {}
    ops = timed["op_times"]
    for op in ("embed", "attention", "gdn_rule", "linear_gemv"):  # linear_gemv: decode warm-ups, short chunks
        assert ops[op]["calls"] > 0 and ops[op]["device_us"] > 0, (op, ops)


@pytest.mark.usefixtures("f32_prefill_gemm")
def test_graph_of_a_batch_size_is_captured_once(tiny_artifacts):
    """A second request of the same shape replays the graph the first one captured: no capture, a replay per
    decode step, the same tokens (on other KV pages and another state slot's history), and host time per replay
    well under the capture's."""
    with Engine.open_sync(tiny_artifacts["qwen3_5"], _options(kv_dtype="bf16", max_concurrency=1)) as engine:
        prompt = np.random.default_rng(5).integers(0, engine.info.vocab_size, 100).tolist()
        first = _run(engine, [prompt], 40)
        before = _graph_counts(engine)
        assert before["graph_captures"] >= 1
        assert "batch sizes captured so far: 1" in engine.memory_plan()["summary"]
        second = _run(engine, [prompt], 40)
        after = _graph_counts(engine)
    assert second == first
    assert after["graph_captures"] == before["graph_captures"], (before, after)
    replays = after["graph_replays"] - before["graph_replays"]
    assert replays >= 38, (before, after)  # 39 decode steps: the first token comes from the prefill
    per_replay = (after["graph_replay_host_us"] - before["graph_replay_host_us"]) / replays
    per_capture = before["graph_capture_host_us"] / before["graph_captures"]
    assert per_replay < per_capture, (per_replay, per_capture)


@pytest.mark.usefixtures("f32_prefill_gemm")
def test_cancelled_lane_leaves_the_others_as_single_runs(tiny_artifacts):
    """With graphs: a lane cancelled mid-generation (its batch shrinks at whatever step the cancel lands) leaves the
    other lanes' tokens those of their single runs."""
    path = tiny_artifacts["qwen3_5"]
    with Engine.open_sync(path, _options(kv_dtype="bf16")) as engine:
        prompts = _prompts(engine.info.vocab_size, 3)
        together = _run_staggered(engine, prompts, [30, 30, 30], stop_after={1: 6})
        plan = engine.memory_plan()
        assert plan["graph_replays"] > 0, plan
    with Engine.open_sync(path, _options(kv_dtype="bf16", max_concurrency=1)) as engine:
        alone = [_run(engine, [prompts[i]], 30)[0] for i in (0, 2)]
    assert len(together[1][0]) >= 6
    for (t_tokens, t_lp), (a_tokens, a_lp) in zip([together[0], together[2]], alone, strict=True):
        assert t_tokens == a_tokens
        np.testing.assert_allclose(t_lp, a_lp, atol=1e-4)


def test_memory_plan_auto_capacity(tiny_artifacts):
    options = _options(kv_capacity="auto", max_context=4096)
    with Engine.open_sync(tiny_artifacts["qwen3_5"], options) as engine:
        plan = engine.memory_plan()
        assert plan["backend"] == "cuda"
        assert plan["weights"] > 0
        # Tiny model, big device: auto capacity is capped at the default pool: max_context per lane (the decision
        # lane's too) and kDecisionRowPages (4) pages of 64 tokens per decision question row (cpp/runtime/engine.h).
        lanes = options.max_concurrency + options.decision_lanes
        assert plan["kv_capacity_tokens"] == 4096 * lanes + options.decision_lanes * options.decision_rows * 4 * 64
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
        lanes = engine.options.max_concurrency + engine.options.decision_lanes  # decision lanes pass rows too
        assert f"{4096 + lanes} rows" in plan["summary"], plan["summary"]
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


@pytest.mark.usefixtures("f32_prefill_gemm")
@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_5_moe"])
def test_a_decisions_questions_are_one_pass_with_the_answers_of_one_at_a_time(tiny_artifacts, kind):
    # Ten questions over a context that fills max_context but for the longest suffix: one pass for all the
    # suffixes (each a fork of the context: its KV pages shared, its GDN state a device copy), with the answers of
    # the sequential twin (one row: each question alone in its own pass).
    rng = np.random.default_rng()
    context = rng.integers(3, 5000, int(rng.integers(130, 400))).tolist()
    questions = [(rng.integers(3, 5000, int(rng.integers(1, 48))).tolist(),
                  rng.choice(5000, int(rng.integers(1, 5)), replace=False).tolist()) for _ in range(10)]
    options = OPTION_DEFAULTS | {"max_context": len(context) + max(len(s) for s, _ in questions),
                                 "max_concurrency": 1, "prefill_chunk": 512}
    with Engine.open_sync(tiny_artifacts[kind], EngineOptions(**options, decision_rows=1)) as one_at_a_time:
        want = asyncio.run(one_at_a_time.decide(context, questions))
    with Engine.open_sync(tiny_artifacts[kind], EngineOptions(**options, decision_rows=10)) as batched:
        asyncio.run(batched.decide(context, questions))  # the context's blocks and snapshot go to the cache
        before = batched.stats().forward_passes
        got = asyncio.run(batched.decide(context, questions))
        passes = batched.stats().forward_passes - before
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, err_msg=str((context, questions)))
    assert passes == 1 + (len(context) % 64 > 0)  # the context's tail after its last block boundary, then the rows
