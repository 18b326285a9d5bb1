"""Prefix reuse on the CPU: a multi-turn session (a system prompt, then turns of user text and a generated answer,
each turn's prompt the whole conversation so far, the answers sent back verbatim) with the prefix cache on and off;
the time to first token of every turn and the prompt tokens each turn reused.

Run: .venv/bin/python bench/cpu_prefix_cache.py [--artifact PATH] [--system N] [--turns T] [--user N]
         [--answer N] [--threads N] [--out bench/results/cpu_prefix_cache.json]

The default artifact is the embedded default model (SmolLM2-135M, a plain decoder: KV blocks reused at any block
boundary); give a Qwen3.5 artifact (e.g. a tiny one from the test cache) for the hybrid path with state snapshots.
Token ids are random (the cost of a prefill does not depend on them). TTFT is the engine's own (submit to first
token). Not a test: figures depend on the machine and its load (recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
from pathlib import Path

import numpy as np

from cpu_linear import cpu_name  # bench/ is the script's directory
from ninfer.default_model import default_model_path
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams


async def _turn(engine: Engine, prompt: list[int], answer: int) -> tuple[list[int], float, int]:
    tokens: list[int] = []
    last = None
    request = Request(prompt, SamplingParams(temperature=0), max_new_tokens=answer, stop_token_ids=())
    async for ev in engine.generate(request):
        tokens.extend(ev.token_ids)
        last = ev
    return tokens, last.timings.ttft_s, last.usage.cached_tokens


def session(path: Path, prefix_cache: bool, args: argparse.Namespace) -> list[dict]:
    rng = np.random.default_rng(args.seed)
    options = EngineOptions(backend="cpu", max_context=args.system + args.turns * (args.user + args.answer) + 64,
                            max_concurrency=1, threads=args.threads, prefix_cache=prefix_cache)
    rows = []
    with Engine.open_sync(path, options) as engine:
        vocab = engine.info.vocab_size
        conversation = rng.integers(3, vocab, args.system).tolist()
        for turn in range(args.turns):
            conversation += rng.integers(3, vocab, args.user).tolist()
            answer, ttft, cached = asyncio.run(_turn(engine, conversation, args.answer))
            rows.append({"turn": turn + 1, "prompt_tokens": len(conversation), "cached_tokens": cached,
                         "ttft_ms": round(ttft * 1e3, 2)})
            conversation += answer
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--artifact", type=Path)
    p.add_argument("--system", type=int, default=1024)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--user", type=int, default=128)
    p.add_argument("--answer", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    path = args.artifact or default_model_path(progress=False)
    on, off = session(path, True, args), session(path, False, args)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    result = {"artifact": str(path), "cpu": cpu_name(), "threads": args.threads, "load_average": os.getloadavg(),
              "commit": commit, "session": {k: getattr(args, k) for k in ("system", "turns", "user", "answer")},
              "turns": [{"turn": a["turn"], "prompt_tokens": a["prompt_tokens"], "cached_tokens": a["cached_tokens"],
                         "ttft_ms_reuse": a["ttft_ms"], "ttft_ms_no_reuse": b["ttft_ms"]}
                        for a, b in zip(on, off, strict=True)]}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
