"""MTP speculative decoding on the CUDA backend (docs/speculative-decoding.md).

- The ops: a verify pass hands the Gated DeltaNet ops chains of one-row sequences, each continuing from the state
  slot the one before writes (SequenceRows::source_slot). The fast kernels run a chain in one launch (the state in
  registers between rows); the slow twins ("cuda-reference") and the CPU backend copy each row's source first and
  run the rows in order. All three agree, on fresh random inputs with prefill and plain decode rows in the same call.
- The model: a verify pass's rows are plain decode steps within the backend's bound, and the state it keeps is the
  decoded sequence's.
- The engine: greedy output with --spec mtp is token for token plain decoding for K = 1..5, dense and MoE, three
  lanes, prompts ending on and off 64-token pages; seeded sampling too (verify rows drawn by the device sampler with
  the counter and history plain decoding has there); verify passes replayed as CUDA graphs equal eager ones;
  constrained requests' verify rows drawn under the caller's mask of each row.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import agreeing_mtp
import numpy as np
import pytest
from draft_masks import HistoryMasks
from mtp_drafts import check_drafts_against_the_twin
from ninfer import _testing
from ninfer.artifact.convert import convert
from ninfer.artifact.reader import read_artifact
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams
from test_cuda_backend import GDN_TF32_REL, assert_close, assert_gdn_rule_close, gdn_rule_inputs

pytestmark = pytest.mark.gpu

MAX_CONTEXT = 512


def _chain_layout(rng: np.random.Generator, lanes: int) -> tuple[list[int], list[int], list[int], int]:
    """(ns, slots, sources, slot count) of one call: a prefill sequence, then per lane a plain decode row and a
    verify chain of 2..6 rows (row 0 continues from the lane's own slot, row t from row t - 1's), in a shuffled
    slot order so that no layout happens to be the identity."""
    free = list(rng.permutation(64))
    ns, slots, sources = [int(rng.integers(2, 40))], [free.pop()], [-1]
    for _ in range(lanes):
        ns.append(1)
        slots.append(free.pop())
        sources.append(-1)
        source = free.pop()  # the lane's slot: read, never written
        for _ in range(int(rng.integers(2, 7))):
            ns.append(1)
            slots.append(free.pop())
            sources.append(source)
            source = slots[-1]
    return ns, slots, sources, 64


@pytest.mark.parametrize("shape", [(16, 48, 128, 128), (2, 4, 32, 16)], ids=["27b", "tiny"])
def test_verify_chains_in_the_delta_rule_match_the_twins(shape):
    hk, hv, dk, dv = shape
    rng = np.random.default_rng()
    ns, slots, sources, count = _chain_layout(rng, lanes=2)
    q, k, v, g, beta, _ = gdn_rule_inputs(hk, hv, dk, dv, ns)
    states = (rng.standard_normal((count, hv * dk * dv)) * 0.1).astype(np.float32)
    runs = {name: _testing.cuda.Ops(name).gdn_rule(q, k, v, g, beta, ns, slots, hk, hv, dk, dv, 64, states, sources)
            for name in ("cuda", "cuda-reference", "cpu")}
    # The prefill sequence takes the chunked form (its tensor-core scan from dk 64 on): the tf32 bound for it.
    rel = GDN_TF32_REL if dk >= 64 else 2e-4
    assert_gdn_rule_close(runs["cuda"], runs["cpu"], "verify chains, fast vs cpu", rel)
    assert_gdn_rule_close(runs["cuda-reference"], runs["cpu"], "verify chains, twin vs cpu")
    # The chains' rows alone are decode steps: the f32 bound, against the twin.
    chain_rows = np.arange(ns[0], sum(ns))
    fast_out, twin_out = runs["cuda"][0][chain_rows], runs["cuda-reference"][0][chain_rows]
    assert_close(fast_out, twin_out, 0, "chain rows", atol=2e-4 * np.abs(twin_out).max())
    # Every source slot is read only: each chain's lane slot keeps its input state.
    lane_slots = [s for s, prev in zip(sources, [-1, *slots[:-1]], strict=True) if s >= 0 and s != prev]
    np.testing.assert_array_equal(runs["cuda"][1][lane_slots], states[lane_slots])


@pytest.mark.parametrize("fused", [False, True], ids=["conv", "conv_qkv"])
def test_verify_chains_in_the_causal_conv_match_the_twins(fused):
    hk, hv, dk, dv, kernel = 2, 4, 32, 16, 4
    channels = 2 * hk * dk + hv * dv
    rng = np.random.default_rng()
    ns, slots, sources, count = _chain_layout(rng, lanes=3)
    mixed = rng.standard_normal((sum(ns), channels)).astype(np.float32)
    w = rng.standard_normal((channels, kernel)).astype(np.float32)
    states = rng.standard_normal((count, channels * (kernel - 1))).astype(np.float32)
    runs = {}
    for name in ("cuda", "cuda-reference", "cpu"):
        ops = _testing.cuda.Ops(name)
        if fused:
            runs[name] = ops.gdn_conv_qkv(mixed, ns, slots, hk, hv, dk, dv, w, kernel, dk ** -0.5, states, sources)
        else:
            runs[name] = ops.gdn_conv(mixed, ns, slots, channels, w, kernel, states, sources)
    for name in ("cuda", "cuda-reference"):
        for got, want in zip(runs[name], runs["cpu"], strict=True):
            assert_close(np.asarray(got), np.asarray(want), 0, f"{name} conv", atol=1e-5 * np.abs(want).max())


@pytest.fixture(scope="session")
def artifacts(tiny_artifacts, tmp_path_factory, tiny_qwen3_5) -> dict[str, Path]:
    """The tiny dense and MoE artifacts, and the dense one with an agreeing MTP head (tests/agreeing_mtp.py: whole
    rounds accepted), with 5 % of its Gated DeltaNet output kept (rounds stop anywhere), and with a 96-row draft
    shortlist (`ninfer convert --draft-vocab 96`)."""
    folder = tmp_path_factory.mktemp("agreeing")
    shortlisted = folder / "shortlist96.bf16.ninfer"
    convert(tiny_qwen3_5, shortlisted, recipe="bf16", progress=False, draft_vocab=96)
    return {"dense": tiny_artifacts["qwen3_5"], "moe": tiny_artifacts["qwen3_5_moe"],
            "agreeing": agreeing_mtp.agreeing_artifact(folder, tiny_qwen3_5),
            "partly": agreeing_mtp.agreeing_artifact(folder, tiny_qwen3_5, gdn_scale=0.05),
            "shortlist": shortlisted}


@pytest.mark.parametrize("model", ["dense", "moe", "shortlist"])
def test_drafts_on_the_device_are_the_heads_argmax_chain(artifacts, model):
    """Model.mtp_drafts (argmax, next token and hidden row on the device) against mtp_logits steps with the argmax
    on the host; the twin's lm-head runs on the rows of its step, so a draft is held within the f32 sums' order."""
    m = _testing.Model.open(str(artifacts[model]), max_context=256, max_sequences=8, kv_dtype="f32", backend="cuda")
    shortlist = None
    if model == "shortlist":
        (ids,) = read_artifact(artifacts[model]).tensor_bytes("mtp.draft_vocab").values()
        shortlist = np.asarray(ids).astype(np.int64)
    rng = np.random.default_rng()
    for drafts in (1, 3, 5):
        prompt = rng.integers(0, m.config["vocab_size"], int(rng.integers(2, 40))).astype(np.int32)
        check_drafts_against_the_twin(m, prompt, drafts, rel_tol=1e-5, shortlist=shortlist)


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_a_verify_pass_is_decode_steps_row_for_row(artifacts, model):
    """Every verify row's logits are the decode step's within the CUDA backend's bound (different row counts take
    different GEMV tiles: f32 sums in another order), and the state kept after row `keep` continues as the decoded
    sequence's does."""
    rng = np.random.default_rng()
    m = _testing.Model.open(str(artifacts[model]), max_context=256, max_sequences=12, kv_dtype="f32", backend="cuda")
    vocab = m.config["vocab_size"]
    prompt = rng.integers(0, vocab, size=int(rng.integers(1, 130))).astype(np.int32)
    rows = rng.integers(0, vocab, size=int(rng.integers(2, 7))).astype(np.int32)
    keep = int(rng.integers(0, len(rows)))
    after = int(rng.integers(0, vocab))
    verified, decoded, kept = m.new_sequence(), m.new_sequence(), m.new_sequence()
    for seq in (verified, decoded, kept):
        m.prefill(seq, prompt)
    logits = np.asarray(m.verify(verified, rows, keep))
    steps = np.concatenate([np.asarray(m.decode(decoded, int(t))) for t in rows])
    assert_close(logits, steps, 0, "verify rows vs decode steps", atol=1e-3 * np.abs(steps).max())
    for t in rows[:keep + 1]:
        m.decode(kept, int(t))
    a, b = np.asarray(m.decode(verified, after)), np.asarray(m.decode(kept, after))
    assert_close(a, b, 0, "after the kept row", atol=1e-3 * np.abs(b).max())
    for seq in (verified, decoded, kept):
        m.release(seq)


def _options(k: int, **kw) -> EngineOptions:
    spec = {"spec": "mtp", "draft_tokens": k} if k else {}
    # The prefill GEMM's f32 twin: its fast paths round activations to bf16, and a pass of more than 8 rows (three
    # lanes verifying three drafts each) takes it, so the verify rows would differ from decode steps by that.
    base = {"backend": "cuda", "max_context": MAX_CONTEXT, "max_concurrency": 3, "kv_dtype": "f32",
            "cuda_gemm": "twin"}
    return EngineOptions(**(base | spec | kw))


def _run(artifact: Path, options: EngineOptions, prompts, new_tokens: int, **sampling):
    async def one(engine, prompt):
        tokens, logprobs, last = [], [], None
        request = Request(prompt, SamplingParams(**sampling), max_new_tokens=new_tokens, stop_token_ids=(),
                          logprobs=True)
        async for ev in engine.generate(request):
            tokens += ev.token_ids
            logprobs += ev.logprobs or ()
            last = ev
        return tokens, logprobs, last

    async def everything(engine):
        return await asyncio.gather(*(one(engine, p) for p in prompts))

    with Engine.open_sync(artifact, options) as engine:
        results = asyncio.run(everything(engine))
        return results, engine.stats(), engine.memory_plan()


def _prompts(rng: np.random.Generator, vocab: int, lengths) -> list[list[int]]:
    return [rng.integers(0, vocab, size=n).tolist() for n in lengths]


def _vocab(artifact: Path) -> int:
    return _testing.Model.open(str(artifact), max_context=64).config["vocab_size"]


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_greedy_output_is_plain_decoding_for_every_draft_count(artifacts, model):
    rng = np.random.default_rng()
    prompts = _prompts(rng, _vocab(artifacts[model]), (64, 63, 129))  # on, before and after a page boundary
    plain, _, _ = _run(artifacts[model], _options(0), prompts, 20, temperature=0)
    for k in range(1, 6):
        spec, stats, _ = _run(artifacts[model], _options(k), prompts, 20, temperature=0)
        assert [r[0] for r in spec] == [r[0] for r in plain], f"K = {k}"
        assert stats.draft_tokens > 0
        for (_, lp_plain, _), (_, lp_spec, last) in zip(plain, spec, strict=True):
            np.testing.assert_allclose(lp_spec, lp_plain, rtol=0, atol=2e-3)
            assert last.timings.draft_n > 0


@pytest.mark.parametrize("artifact", ["agreeing", "partly"])
def test_accepted_runs_keep_the_state_of_their_last_row(artifacts, artifact):
    """With drafts accepted (all of them, or some), greedy and seeded-sampled output equal plain decoding's: the
    kept state is the last accepted row's and sampled verify rows are the draws plain decoding makes there."""
    rng = np.random.default_rng()
    prompts = _prompts(rng, _vocab(artifacts[artifact]), (30, 64, 90))
    seed = int(rng.integers(1 << 30))
    for sampling in ({"temperature": 0}, {"temperature": 0.8, "top_k": 20, "top_p": 0.95, "seed": seed,
                                          "presence_penalty": 0.3}):
        plain, _, _ = _run(artifacts[artifact], _options(0), prompts, 40, **sampling)
        for k in (2, 5):
            spec, stats, _ = _run(artifacts[artifact], _options(k), prompts, 40, **sampling)
            assert [r[0] for r in spec] == [r[0] for r in plain], f"K = {k}, {sampling}"
            assert stats.draft_tokens_accepted > 0
            if artifact == "agreeing" and sampling["temperature"] == 0:
                assert stats.draft_tokens_accepted >= 0.9 * stats.draft_tokens


def test_verify_rows_stay_on_the_decode_path(artifacts):
    """Four lanes at K = 3 would verify 16 rows a pass, which takes the prefill GEMM at several times a decode pass's
    cost (bench/NOTES-cuda.md, session 12): with four lanes decoding, each drafts 8 / 4 - 1 = 1 a round. Lanes
    admitted a step apart may draft more while fewer decode (at most 2 extra in each of 3 such rounds); without the
    cap a lane would draft ~3 a round. The output stays plain decoding's."""
    rng = np.random.default_rng()
    prompts = _prompts(rng, _vocab(artifacts["dense"]), (40, 40, 40, 40))
    plain, _, _ = _run(artifacts["dense"], _options(0, max_concurrency=4), prompts, 16, temperature=0)
    spec, stats, _ = _run(artifacts["dense"], _options(3, max_concurrency=4), prompts, 16, temperature=0)
    assert [r[0] for r in spec] == [r[0] for r in plain]
    assert stats.draft_tokens > 0
    for _, _, last in spec:
        assert last.timings.draft_n <= last.usage.generated_tokens + 6, (last.timings.draft_n, last.usage)


def test_verify_passes_replayed_as_graphs_equal_eager_passes(artifacts):
    rng = np.random.default_rng()
    prompts = _prompts(rng, _vocab(artifacts["partly"]), (20, 64, 100))
    graphs, _, plan = _run(artifacts["partly"], _options(3), prompts, 40, temperature=0)
    eager, _, eager_plan = _run(artifacts["partly"], _options(3, cuda_graphs=False), prompts, 40, temperature=0)
    # The same tokens; logprobs within the split-KV decode kernel's order of sums, not bit for bit: the three
    # requests are admitted as the engine thread sees them, so a lane may start a step earlier in one run and meet
    # other batch sizes, whose split count differs (session 12 measured 9.5e-7 between two runs of the same arm,
    # graphs or eager alike; test_graph_replays_across_pages_and_batch_changes_equal_eager has the same cause).
    for (g_tokens, g_lp, _), (e_tokens, e_lp, _) in zip(graphs, eager, strict=True):
        assert g_tokens == e_tokens
        np.testing.assert_allclose(g_lp, e_lp, rtol=0, atol=5e-4)
    # Three lanes verifying 3 drafts each is one shape, (3 lanes, 4 rows); (2, 4) and (1, 4) once lanes end.
    assert plan["graph_replays"] > 0 and plan["graphs_captured"] >= 1, plan
    assert plan["graph_draft_passes"] > 0, plan  # each round's drafting ran as a graph too
    assert eager_plan["graph_replays"] == 0 and eager_plan["graph_draft_passes"] == 0


def _run_constrained(artifact: Path, options: EngineOptions, prompts, constraints, new_tokens: int, **sampling):
    async def one(engine, prompt, constraint):
        tokens = []
        request = Request(prompt, SamplingParams(**sampling), max_new_tokens=new_tokens, stop_token_ids=(),
                          constraint=constraint)
        async for ev in engine.generate(request):
            tokens += ev.token_ids
        return tokens

    async def everything(engine):
        return await asyncio.gather(*(one(engine, p, c) for p, c in zip(prompts, constraints, strict=True)))

    with Engine.open_sync(artifact, options) as engine:
        return asyncio.run(everything(engine)), engine.stats()


def test_constrained_verify_rows_are_drawn_under_their_masks_on_the_device(artifacts):
    """A stand-in grammar (tests/draft_masks.py: each position's mask a function of the history) on the agreeing
    head, whose drafts only the masks reject: each verify row goes to the device sampler with the caller's mask
    after the drafts before it, and greedy and seeded output equal plain decoding's under the same masks."""
    rng = np.random.default_rng()
    prompts = _prompts(rng, _vocab(artifacts["agreeing"]), (30, 64))
    seeds = [int(s) for s in rng.integers(1 << 30, size=2)]
    for sampling in ({"temperature": 0}, {"temperature": 0.5, "top_k": 3, "seed": seeds[0]}):
        plain, _ = _run_constrained(artifacts["agreeing"], _options(0), prompts, [HistoryMasks(s) for s in seeds],
                                    24, **sampling)
        for k in (1, 3, 5):
            constraints = [HistoryMasks(s) for s in seeds]
            spec, stats = _run_constrained(artifacts["agreeing"], _options(k), prompts, constraints, 24, **sampling)
            assert spec == plain, f"K = {k}, {sampling}"
            assert sum(c.forbidden for c in constraints) > 0 and stats.draft_tokens_accepted > 0
