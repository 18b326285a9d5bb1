"""Decision latency (issue 16 deliverable 7): `Engine.decide` p50/p95 for 1 and 10 questions over a shared state
of --state tokens, cold (a state the prefix cache has never seen) and cached (the same state again: its snapshot
is restored and only the tail after its last block boundary is computed), and a rerank of --docs documents (the
query as the shared context, one yes/no question per document, as /v1/rerank runs it).

    python bench/decision_latency.py --out bench/results/decision_latency_cpu.json          # embedded default
    python bench/decision_latency.py --backend cuda --model qwen3.5-27b --recipe groupwise-int \\
        --out bench/results/decision_latency_27b_int4.json                                   # H200, random weights

Token ids are random (a prefill's cost does not depend on them); the shapes are those of the decision routes'
prompts: a question's suffix is --suffix tokens (its user turn and the assistant opener), a rerank document
--doc-tokens, two candidate tokens each. Latency is wall time around `Engine.decide` (submit to answers), after one
warm-up decision of the same shape. Every run records the tokens the engine prefilled and the prompt tokens the
prefix cache served, so a cached figure shows what it skipped. Not a test: figures depend on the machine and its
load (recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from cuda_engine import op_time_split  # noqa: E402
from cuda_kernels import source_commit  # noqa: E402

from ninfer.default_model import default_model_path  # noqa: E402
from ninfer.engine import CUDA_GEMMS, Engine, EngineOptions  # noqa: E402

Question = tuple[list[int], list[int]]


def random_ids(rng: np.random.Generator, vocab: int, n: int) -> list[int]:
    return rng.integers(3, min(vocab, 200000), n).tolist()


def questions(rng: np.random.Generator, vocab: int, count: int, suffix: int) -> list[Question]:
    return [(random_ids(rng, vocab, suffix), random_ids(rng, vocab, 2)) for _ in range(count)]


def timed_decide(engine: Engine, context: list[int], qs: list[Question]) -> dict:
    before = engine.stats()
    start = time.perf_counter()
    asyncio.run(engine.decide(context, qs))
    wall = time.perf_counter() - start
    after = engine.stats()
    return {"ms": wall * 1e3, "prefilled": after.tokens_prefilled - before.tokens_prefilled,
            "cached": after.prefix.cached_tokens - before.prefix.cached_tokens,
            "passes": after.forward_passes - before.forward_passes}


def scenario(engine: Engine, rng: np.random.Generator, name: str, state: int, count: int, suffix: int,
             cached: bool, runs: int, op_times: bool = False) -> dict:
    """`runs` decisions of `count` questions over a `state`-token context: a new context each run (cold), or the
    one context of a warm-up run every time (cached). Fresh questions each run. `op_times` (an engine opened with
    cuda_op_times): each run also records its device time per backend op."""
    vocab = engine.info.vocab_size
    context = random_ids(rng, vocab, state)
    timed_decide(engine, context, questions(rng, vocab, count, suffix))  # warm-up (and the cached state)
    rows = []
    for _ in range(runs):
        if not cached:
            context = random_ids(rng, vocab, state)
        before = engine.memory_plan()["op_times"] if op_times else None
        rows.append(timed_decide(engine, context, questions(rng, vocab, count, suffix)))
        if op_times:
            rows[-1]["op_times"] = op_time_split(before, engine.memory_plan()["op_times"])
    ms = [r["ms"] for r in rows]
    return {"name": name, "state_tokens": state, "questions": count, "suffix_tokens": suffix, "cached": cached,
            "runs": rows, "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95))}


def artifact_path(args: argparse.Namespace, tmp: str) -> tuple[Path, float]:
    """The model to open and the seconds spent writing it: the embedded default (or --artifact) on the CPU; a
    synthetic artifact at the real shapes on CUDA (written unless --artifact names one that exists)."""
    if args.backend == "cpu":
        return args.artifact or default_model_path(progress=False), 0.0
    from synthetic import write_synthetic

    path = args.artifact or Path(tmp) / f"{args.model}.{args.recipe}.ninfer"
    start = time.perf_counter()
    if not path.exists():
        write_synthetic(args.model, args.recipe, path, progress=False)
    return path, time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--model", default="qwen3.5-27b", help="CUDA: the synthetic shape (bench/synthetic.py MODELS)")
    p.add_argument("--recipe", default="groupwise-int", help="CUDA: the synthetic artifact's recipe")
    p.add_argument("--artifact", type=Path, help="the model (CPU) or where to keep the synthetic one (CUDA)")
    p.add_argument("--state", type=int, default=2048, help="shared state tokens")
    p.add_argument("--suffix", type=int, default=48, help="tokens of each question's own suffix")
    p.add_argument("--docs", type=int, default=50, help="rerank: documents")
    p.add_argument("--query", type=int, default=64, help="rerank: the query's context tokens")
    p.add_argument("--doc-tokens", type=int, default=160, help="rerank: tokens of each document's suffix")
    p.add_argument("--runs", type=int, default=10, help="timed decisions per scenario")
    p.add_argument("--threads", type=int, default=2, help="CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--op-times", type=int, default=0, metavar="RUNS",
                   help="CUDA: then, on a second engine with op timing, RUNS runs of 1 and 10 questions over the "
                        "cached state, each with its device time per op (kept apart: the events add host work)")
    p.add_argument("--cuda-gemm", choices=CUDA_GEMMS, default="auto",
                   help="CUDA: the prefill GEMM (EngineOptions.cuda_gemm; streamed: the streamed GEMM at every row "
                        "count, for A/B runs)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    commit = source_commit()
    rng = np.random.default_rng(args.seed)
    longest = max(args.state + args.suffix, args.query + args.doc_tokens)
    options = EngineOptions(backend=args.backend, max_context=longest + 64, max_concurrency=1, decision_lanes=1,
                            decision_rows=max(10, min(args.docs, 64)), threads=args.threads,
                            cuda_gemm=args.cuda_gemm)
    with tempfile.TemporaryDirectory() as tmp:
        path, write_s = artifact_path(args, tmp)
        with Engine.open_sync(path, options) as engine:
            plan = engine.memory_plan()
            results = [scenario(engine, rng, f"{count} question{'s' * (count > 1)}, {kind}", args.state, count,
                                args.suffix, kind == "cached", args.runs)
                       for count in (1, 10) for kind in ("cold", "cached")]
            results += [scenario(engine, rng, f"rerank {args.docs} documents, {kind}", args.query, args.docs,
                                 args.doc_tokens, kind == "cached", args.runs) for kind in ("cold", "cached")]
        timed = []
        if args.op_times and args.backend == "cuda":  # (the first engine closed: one model on the device at a time)
            with Engine.open_sync(path, replace(options, cuda_op_times=True)) as engine:
                timed = [scenario(engine, rng, f"{count} question{'s' * (count > 1)}, cached, op times", args.state,
                                  count, args.suffix, True, args.op_times, op_times=True) for count in (1, 10)]
    device = "cpu"
    if args.backend == "cuda":
        from ninfer import _engine

        device = _engine.cuda.device_name()
    out = {"device": device, "backend": args.backend, "cuda_gemm": args.cuda_gemm, "commit": commit,
           "artifact": str(path),
           "model": args.model if args.backend == "cuda" else path.name, "recipe": args.recipe,
           "artifact_write_s": write_s, "threads": args.threads, "load_average": os.getloadavg(),
           "memory_plan_summary": plan.get("summary", ""), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "scenarios": results, "op_time_scenarios": timed}
    for r in results + timed:
        per_run = r["runs"][0]
        print(f"{r['name']:34s} p50 {r['p50_ms']:9.1f} ms  p95 {r['p95_ms']:9.1f} ms  "
              f"(prefilled {per_run['prefilled']} tokens, {per_run['cached']} from the cache, "
              f"{per_run['passes']} passes, per run)")
        if "op_times" in per_run:
            ops = per_run["op_times"]
            total = sum(t["device_us"] for t in ops.values())
            print(f"  device op time {total / 1e3:.1f} ms: " + ", ".join(
                f"{op} {t['device_us'] / 1e3:.1f} ({t['calls']})" for op, t in list(ops.items())[:8]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
