"""Speculative decoding with the embedded SmolLM2's trained MTP head on the CPU: acceptance and end-to-end speed
of `--spec mtp` at K = 1..3 against plain decoding, on the fixed prompt set (bench/mtp_head/prompts.py: 4 chat,
4 code, 4 JSON prompts, none seen in training).

Run: OMP_WAIT_POLICY=passive .venv/bin/python bench/cpu_speculative.py [--artifact PATH] [--threads 2]
         [--max-new 128] [--ks 1,2,3] [--out bench/results/cpu_speculative_smollm2.json]

Greedy, one request at a time (C = 1). Every configuration's engine is open at once and each prompt runs through all
of them back to back, so a change in the machine's load hits every configuration alike. Per prompt and
configuration: the generated tokens (checked identical to plain decoding), llama.cpp's draft_n / draft_n_accepted,
the decode wall time (first token to last) and the process CPU time over it. Derived: acceptance =
accepted / drafted; tokens per target pass = decode tokens / (decode tokens - accepted) (each pass is a verify
round, or a plain step where a round cannot draft); speed-up = plain's time per decode token over the
configuration's, by wall time and by CPU time (on a shared machine wall time mostly measures waiting for a core).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "mtp_head"))
from cpu_linear import cpu_name
from ninfer.default_model import default_model_path
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams
from prompts import EVAL_PROMPTS


async def _run(engine: Engine, tokens: list[int], max_new: int) -> dict:
    start = time.perf_counter()
    first = first_cpu = None
    out: list[int] = []
    last = None
    async for ev in engine.generate(Request(tokens, SamplingParams(temperature=0), max_new_tokens=max_new)):
        if ev.token_ids and first is None:
            first, first_cpu = time.perf_counter(), time.process_time()
        out.extend(ev.token_ids)
        last = ev
    end, end_cpu = time.perf_counter(), time.process_time()
    return {"tokens": out, "decode_s": end - first, "decode_cpu_s": end_cpu - first_cpu,
            "draft_n": last.timings.draft_n, "draft_n_accepted": last.timings.draft_n_accepted,
            "total_s": end - start}


def _summary(rows: list[dict], plain: list[dict] | None) -> dict:
    decoded = sum(len(r["tokens"]) - 1 for r in rows)
    drafted = sum(r["draft_n"] for r in rows)
    accepted = sum(r["draft_n_accepted"] for r in rows)
    wall = sum(r["decode_s"] for r in rows)
    cpu = sum(r["decode_cpu_s"] for r in rows)
    out = {"decode_tokens": decoded, "draft_n": drafted, "draft_n_accepted": accepted,
           "acceptance": accepted / drafted if drafted else None,
           "tokens_per_target_pass": decoded / (decoded - accepted),
           "decode_tok_s": decoded / wall, "decode_cpu_ms_per_token": 1e3 * cpu / decoded}
    if plain is not None:
        base = _summary(plain, None)
        out["speedup_wall"] = out["decode_tok_s"] / base["decode_tok_s"]
        out["speedup_cpu"] = base["decode_cpu_ms_per_token"] / out["decode_cpu_ms_per_token"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", type=Path, default=None, help="default: the embedded default model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--ks", default="1,2,3")
    ap.add_argument("--out", type=Path, default=Path("bench/results/cpu_speculative_smollm2.json"))
    args = ap.parse_args()
    artifact = args.artifact or default_model_path(progress=False)
    ks = [int(k) for k in args.ks.split(",")]
    configs = {"plain": {}, **{f"K{k}": {"spec": "mtp", "draft_tokens": k} for k in ks}}
    engines = {name: Engine.open_sync(artifact, EngineOptions(backend="cpu", threads=args.threads, max_context=2048,
                                                              prefix_cache=False, **spec))
               for name, spec in configs.items()}
    frontend = engines["plain"].frontend
    prompts = [(family, frontend.encode(frontend.render([{"role": "user", "content": text}],
                                                        add_generation_prompt=True).text), text)
               for family, text in EVAL_PROMPTS]
    rows: dict[str, list[dict]] = {name: [] for name in configs}
    load = [os.getloadavg()[0]]
    try:
        for name, engine in engines.items():  # warm-up: one short answer each
            asyncio.run(_run(engine, prompts[0][1], 8))
        for family, tokens, text in prompts:
            for name, engine in engines.items():
                r = asyncio.run(_run(engine, tokens, args.max_new))
                r.update(family=family, prompt=text)
                rows[name].append(r)
            same = all(rows[n][-1]["tokens"] == rows["plain"][-1]["tokens"] for n in configs)
            print(f"{family}: {text[:50]!r} tokens {len(rows['plain'][-1]['tokens'])} identical {same} " + " ".join(
                f"{n} {rows[n][-1]['draft_n_accepted']}/{rows[n][-1]['draft_n']}" for n in configs if n != "plain"),
                flush=True)
            load.append(os.getloadavg()[0])
    finally:
        for engine in engines.values():
            engine.close()
    identical = all(r["tokens"] == p["tokens"] for n in configs for r, p in zip(rows[n], rows["plain"], strict=True))
    result = {
        "bench": "cpu_speculative", "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                             check=True, capture_output=True, text=True).stdout.strip(),
        "artifact": Path(artifact).name, "cpu": cpu_name(), "cores": os.cpu_count(), "threads": args.threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "max_new_tokens": args.max_new, "concurrency": 1,
        "greedy": True, "load_avg_1m": [min(load), max(load)], "outputs_identical_to_plain": identical,
        "overall": {n: _summary(rows[n], None if n == "plain" else rows["plain"]) for n in configs},
        "by_family": {f: {n: _summary([r for r in rows[n] if r["family"] == f],
                                      None if n == "plain" else [r for r in rows["plain"] if r["family"] == f])
                          for n in configs} for f in ("chat", "code", "json")},
        "per_prompt": {n: [{k: v for k, v in r.items() if k != "tokens"} | {"generated": len(r["tokens"])}
                           for r in rows[n]] for n in configs},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["overall"], indent=1))


if __name__ == "__main__":
    main()
