"""Prefix reuse on the CUDA backend at the real Qwen3.5 shapes (synthetic weights, bench/synthetic.py): the agent
session of bench/cpu_prefix_cache.py (4k system + tools, 20 turns of 1k user text and a 300-token answer, up to 32k
tokens of context) with reuse and without, its resume from the host tier after an eviction and after the engine was
closed and opened again (a router swap), 8 users sharing a system prompt; and the machine's page-locked host-to-device
copy rate (torch, when it is installed) beside the restore rate the engine's TTFTs imply.

    python bench/cuda_prefix_cache.py --model qwen3.5-27b qwen3.5-35b-a3b --recipe groupwise-int \
        --out bench/results/cuda_prefix_cache.json

--op-split PREFIX [PREFIX ...] instead measures where a reused turn's time goes: for each length, a cached prefix of
PREFIX tokens, then one turn of --user new tokens after it and a prompt of those new tokens alone, each with the
device time per backend op
(EngineOptions.cuda_op_times) beside its TTFT: what the reused turn costs beyond the new tokens' own prefill.

The session's shape is the issue's (cpu_prefix_cache.FULL) unless --system / --turns / --user / --answer change it;
`--model tiny --backend cpu --turns 3` is a dry run of the script on the CPU. The results file is rewritten after
each model, so a run stopped during the second keeps the first.

Of each answer the first --generate tokens are generated (decode speed is bench/cuda_engine.py's business), the rest
are random tokens sent back as the answer.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from cpu_prefix_cache import FULL, commit_sha, random_tokens, run_scenarios, session_options, turn  # noqa: E402
from cuda_engine import op_time_split  # noqa: E402
from ninfer.engine import Engine, EngineOptions  # noqa: E402
from synthetic import MODELS, write_synthetic  # noqa: E402


def pinned_copy_gb_per_s(megabytes: int = 2048) -> dict | None:
    """Copy rates between page-locked host memory and the device (torch, when installed): host-to-device,
    device-to-host, and both at once on two streams, the bounds the host tier's loads and stores run against."""
    try:
        import torch
    except ImportError:
        return None
    host = torch.empty(megabytes << 20, dtype=torch.uint8, pin_memory=True)
    host2 = torch.empty_like(host, pin_memory=True)
    device = torch.empty_like(host, device="cuda")
    device2 = torch.empty_like(device)
    other = torch.cuda.Stream()

    def rate(copies) -> float:
        copies()  # warm-up
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(3):
            copies()
        torch.cuda.synchronize()
        return round(3 * host.numel() / (time.perf_counter() - start) / 1e9, 2)

    def both() -> None:
        device.copy_(host, non_blocking=True)
        with torch.cuda.stream(other):
            host2.copy_(device2, non_blocking=True)

    return {"h2d": rate(lambda: device.copy_(host, non_blocking=True)),
            "d2h": rate(lambda: host2.copy_(device2, non_blocking=True)),
            "both_directions_each": rate(both)}


def bench_model(model: str, recipe: str, path: Path, args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    if not path.exists():
        write_synthetic(model, recipe, path, progress=False)
    written_s = time.perf_counter() - started
    shape = {key: getattr(args, key) or value for key, value in FULL.items()}
    options = session_options(shape, lanes=8, backend=args.backend, verify_checksums=False,
                              host_kv_mib=args.host_kv_mib)

    def open_engine(o: EngineOptions, host_tier=None) -> Engine:
        engine = Engine(path, o, host_tier=host_tier)
        # The longest chunk's scratch and GEMM algorithms, before anything is timed.
        turn(engine, random_tokens(np.random.default_rng(), engine, min(8192, o.max_context - 64)), 1)
        return engine

    result = run_scenarios(open_engine, options, shape, args.generate, args.uncached_every, args.seed)
    return {"model": model, "recipe": recipe, "write_s": round(written_s, 1),
            "wall_s": round(time.perf_counter() - started, 1), **result}


def op_split_model(model: str, recipe: str, path: Path, args: argparse.Namespace) -> dict:
    """For each --op-split length, a reused turn (that many cached tokens, then --user new ones) against a prompt of
    its new tokens alone: TTFT, cached tokens and the device time per op. TTFT minus the ops' sum is host time."""
    if not path.exists():
        write_synthetic(model, recipe, path, progress=False)
    user = args.user or FULL["user"]
    context = -(-(max(args.op_split) + user + 128) // 64) * 64
    options = EngineOptions(backend=args.backend, max_context=context, kv_capacity=2 * context, max_concurrency=1,
                            decision_lanes=0, device_state_slots=8, verify_checksums=False, cuda_op_times=True)
    rng = np.random.default_rng(args.seed)
    rows = []
    with Engine(path, options) as engine:
        turn(engine, random_tokens(rng, engine, min(8192, context - 64)), 1)  # scratch and GEMM algorithms
        for length in args.op_split:
            prefix = random_tokens(rng, engine, length)
            turn(engine, prefix, 1)  # now cached
            new = random_tokens(rng, engine, user)
            for name, prompt in (("reused_turn", prefix + new), ("new_tokens_only", new)):
                before = engine.memory_plan()["op_times"]
                _, ttft, cached = turn(engine, prompt, 1)
                ops = op_time_split(before, engine.memory_plan()["op_times"])
                device_ms = sum(t["device_us"] for t in ops.values()) / 1e3
                rows.append({"case": name, "prompt_tokens": len(prompt), "cached_tokens": cached,
                             "ttft_ms": round(ttft * 1e3, 2), "device_ops_ms": round(device_ms, 2), "op_times": ops})
    return {"model": model, "recipe": recipe, "user": user, "rows": rows}


def print_op_split(m: dict) -> None:
    for r in m["rows"]:
        top = ", ".join(f"{op} {t['device_us'] / 1e3:.1f} ms/{t['calls']}" for op, t in list(r["op_times"].items())[:8])
        print(f"{m['model']} {r['case']}: {r['prompt_tokens']} tokens ({r['cached_tokens']} cached) TTFT "
              f"{r['ttft_ms']} ms, device ops {r['device_ops_ms']} ms: {top}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", nargs="+", choices=sorted(MODELS), required=True)
    p.add_argument("--recipe", default="groupwise-int")
    p.add_argument("--workdir", type=Path, help="keep the synthetic artifacts here (reused when present)")
    p.add_argument("--generate", type=int, default=4)
    p.add_argument("--uncached-every", type=int, default=10)
    p.add_argument("--host-kv-mib", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    for key in FULL:
        p.add_argument(f"--{key}", type=int, help=f"the session's {key} (default {FULL[key]})")
    p.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--op-split", type=int, nargs="+", metavar="PREFIX",
                   help="only the op split of a turn after PREFIX cached tokens, per length (see the description)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.op_split:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = args.workdir or Path(tmp)
            models = [op_split_model(model, args.recipe, workdir / f"{model}.{args.recipe}.ninfer", args)
                      for model in args.model]
        args.out.write_text(json.dumps({"commit": commit_sha(), "backend": args.backend, "models": models},
                                       indent=1) + "\n")
        for m in models:
            print_op_split(m)
        return 0
    result = {"commit": commit_sha(), "backend": args.backend,
              "pinned_copy_gb_per_s": pinned_copy_gb_per_s() if args.backend == "cuda" else None, "models": []}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        for model in args.model:
            m = bench_model(model, args.recipe, workdir / f"{model}.{args.recipe}.ninfer", args)
            result["models"].append(m)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
            last = m["turns"][-1]
            print(f"{m['model']}: written {m['write_s']} s, all {m['wall_s']} s; turn {last['turn']} "
                  f"({last['prompt_tokens']} tokens, {last['cached_tokens']} reused) TTFT {last['ttft_ms_reuse']} ms "
                  f"vs {last.get('ttft_ms_no_reuse')} ms without; from the device {m['resume_device']}; from the "
                  f"host {m['resume_host']} (sibling from the device {m['resume_host_sibling']}); after reopen "
                  f"{m['resume_after_reopen']} (sibling {m['resume_after_reopen_sibling']}); restore "
                  f"{m['resume_host_gb_per_s']} GB/s after an eviction, {m['resume_after_reopen_gb_per_s']} GB/s "
                  f"after the reopen (pinned copies {result['pinned_copy_gb_per_s']} GB/s)",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
