"""Lanes decoding while a long prompt arrives (issue #14 item 2), per EngineOptions.decoding_prefill_chunk: LANES
requests decode (short prompts, long answers); once each has DECODE_WARMUP tokens, a prompt of PROMPT tokens is
submitted. Reported per chunk value: the plain decode step (the median gap between a decoding lane's token events
before the arrival), the largest gap while the prompt is prefilled (and its ratio to the plain step: the issue's
target is under 3x), the gaps' p50 / p99 in that window, the arrival's TTFT in company and alone, and the decoding
lanes' aggregate tokens per second during the prefill. Synthetic weights at the real shapes (bench/synthetic.py).

    python bench/cuda_mixed_batch.py --model qwen3.5-27b --chunks 512 1024 2048 8192 --out $OUT/mixed.json

`--model tiny --backend cpu --prompt 600 --chunks 64 256` is a dry run on the CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from cpu_prefix_cache import commit_sha, random_tokens  # noqa: E402
from ninfer.engine import CUDA_GEMMS, Engine, EngineOptions, Request, SamplingParams  # noqa: E402
from synthetic import MODELS, write_synthetic  # noqa: E402

DECODE_WARMUP = 24  # tokens each decoding lane has before the prompt arrives (its steady state)
AFTER = 16  # tokens each decoding lane still takes after the arrival's first token


async def scenario(engine: Engine, rng: np.random.Generator, lanes: int, prompt: int) -> dict:
    """The decoding lanes' token arrival times and the arrival's submit and first-token times."""
    stamps: list[list[float]] = [[] for _ in range(lanes)]
    arrival = {"submitted": None, "first_token": None}
    done = asyncio.Event()

    async def decode(i: int) -> None:
        request = Request(random_tokens(rng, engine, 16), SamplingParams(temperature=0), max_new_tokens=100_000,
                          stop_token_ids=())
        stream = engine.generate(request)
        try:
            async for ev in stream:
                if ev.token_ids:
                    stamps[i].append(time.perf_counter())
                if done.is_set():
                    return
        finally:
            await stream.aclose()  # cancels the request

    async def arrive() -> None:
        while min(len(s) for s in stamps) < DECODE_WARMUP:
            await asyncio.sleep(0.001)
        request = Request(random_tokens(rng, engine, prompt), SamplingParams(temperature=0), max_new_tokens=1,
                          stop_token_ids=())
        arrival["submitted"] = time.perf_counter()
        async for ev in engine.generate(request):
            if ev.token_ids and arrival["first_token"] is None:
                arrival["first_token"] = time.perf_counter()
        after = [len(s) for s in stamps]
        while min(len(s) - a for s, a in zip(stamps, after, strict=True)) < AFTER:
            await asyncio.sleep(0.001)
        done.set()

    await asyncio.gather(arrive(), *(decode(i) for i in range(lanes)))
    return {"stamps": stamps, **arrival}


def gap_figures(run: dict) -> dict:
    start, end = run["submitted"], run["first_token"]
    before, during = [], []
    for s in run["stamps"]:
        for a, b in itertools.pairwise(s):
            if b <= start:
                before.append(b - a)
            elif a < end:  # a gap that overlaps the prefill window
                during.append(b - a)
    tokens_during = sum(sum(1 for t in s if start < t <= end) for s in run["stamps"])
    plain = float(np.median(before))
    return {"plain_step_ms": round(plain * 1e3, 2), "max_gap_ms": round(max(during) * 1e3, 2),
            "max_gap_over_plain": round(max(during) / plain, 2),
            "gap_p50_ms": round(float(np.percentile(during, 50)) * 1e3, 2),
            "gap_p99_ms": round(float(np.percentile(during, 99)) * 1e3, 2),
            "ttft_ms": round((end - start) * 1e3, 1),
            "decode_tokens_per_s_during_prefill": round(tokens_during / (end - start), 1)}


def ttft_alone(engine: Engine, rng: np.random.Generator, prompt: int) -> float:
    async def one() -> float:
        start = time.perf_counter()
        request = Request(random_tokens(rng, engine, prompt), SamplingParams(temperature=0), max_new_tokens=1,
                          stop_token_ids=())
        async for ev in engine.generate(request):
            if ev.token_ids:
                return time.perf_counter() - start
        raise RuntimeError("no token")

    return asyncio.run(one())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--recipe", default="groupwise-int")
    p.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--lanes", type=int, default=4, help="decoding lanes")
    p.add_argument("--prompt", type=int, default=32768, help="the arriving prompt's tokens")
    p.add_argument("--prefill-chunk", type=int, default=8192, help="the chunk when nothing decodes")
    p.add_argument("--chunks", type=int, nargs="+", required=True, help="decoding_prefill_chunk values to run")
    p.add_argument("--workdir", type=Path, help="keep the synthetic artifact here (reused when present)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cuda-gemm", choices=CUDA_GEMMS, default="auto",
                   help="the prefill GEMM (EngineOptions.cuda_gemm; streamed: the streamed GEMM at every row count)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    result = {"commit": commit_sha(), "model": args.model, "recipe": args.recipe, "backend": args.backend,
              "lanes": args.lanes, "prompt": args.prompt, "prefill_chunk": args.prefill_chunk,
              "cuda_gemm": args.cuda_gemm, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = (args.workdir or Path(tmp)) / f"{args.model}.{args.recipe}.ninfer"
        if not path.exists():
            write_synthetic(args.model, args.recipe, path, progress=False)
        for chunk in args.chunks:
            options = EngineOptions(backend=args.backend, max_context=args.prompt + 512, max_concurrency=args.lanes + 1,
                                    decision_lanes=0, prefill_chunk=min(args.prefill_chunk, max(args.chunks)),
                                    decoding_prefill_chunk=chunk, prefix_cache=False, verify_checksums=False,
                                    cuda_gemm=args.cuda_gemm)
            with Engine(path, options) as engine:
                alone = ttft_alone(engine, rng, args.prompt)  # also warms every pass shape up
                asyncio.run(scenario(engine, rng, args.lanes, 256))  # warms the decode graphs of every batch up
                run = asyncio.run(scenario(engine, rng, args.lanes, args.prompt))
            row = {"decoding_prefill_chunk": chunk, "ttft_alone_ms": round(alone * 1e3, 1), **gap_figures(run)}
            result["runs"].append(row)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
