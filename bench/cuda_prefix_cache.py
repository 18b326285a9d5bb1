"""Prefix reuse on the CUDA backend at the real Qwen3.5 shapes (synthetic weights, bench/synthetic.py): the agent
session of bench/cpu_prefix_cache.py (4k system + tools, 20 turns of 1k user text and a 300-token answer, up to 32k
tokens of context) with reuse and without, its resume from the host tier after an eviction and after the engine was
closed and opened again (a router swap), 8 users sharing a system prompt; and the machine's page-locked host-to-device
copy rate (torch, when it is installed) beside the restore rate the engine's TTFTs imply.

    python bench/cuda_prefix_cache.py --model qwen3.5-27b qwen3.5-35b-a3b --recipe groupwise-int \
        --out bench/results/cuda_prefix_cache.json

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
from synthetic import MODELS, write_synthetic  # noqa: E402

from ninfer.engine import Engine, EngineOptions  # noqa: E402


def pinned_copy_gb_per_s(megabytes: int = 2048) -> float | None:
    """Host-to-device copy rate from page-locked memory (torch), the bound the host tier's restores run against."""
    try:
        import torch
    except ImportError:
        return None
    host = torch.empty(megabytes << 20, dtype=torch.uint8, pin_memory=True)
    device = torch.empty_like(host, device="cuda")
    device.copy_(host, non_blocking=True)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return round(3 * host.numel() / (time.perf_counter() - start) / 1e9, 2)


def bench_model(model: str, recipe: str, path: Path, args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    if not path.exists():
        write_synthetic(model, recipe, path, progress=False)
    written_s = time.perf_counter() - started
    options = session_options(FULL, lanes=8, backend="cuda", verify_checksums=False, host_kv_mib=args.host_kv_mib)

    def open_engine(o: EngineOptions, host_tier=None) -> Engine:
        engine = Engine(path, o, host_tier=host_tier)
        # The longest chunk's scratch and GEMM algorithms, before anything is timed.
        turn(engine, random_tokens(np.random.default_rng(), engine, 8192), 1)
        return engine

    result = run_scenarios(open_engine, options, FULL, args.generate, args.uncached_every, args.seed)
    return {"model": model, "recipe": recipe, "write_s": round(written_s, 1),
            "wall_s": round(time.perf_counter() - started, 1), **result}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", nargs="+", choices=sorted(MODELS), required=True)
    p.add_argument("--recipe", default="groupwise-int")
    p.add_argument("--workdir", type=Path, help="keep the synthetic artifacts here (reused when present)")
    p.add_argument("--generate", type=int, default=4)
    p.add_argument("--uncached-every", type=int, default=10)
    p.add_argument("--host-kv-mib", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        result = {"commit": commit_sha(), "pinned_h2d_gb_per_s": pinned_copy_gb_per_s(),
                  "models": [bench_model(m, args.recipe, workdir / f"{m}.{args.recipe}.ninfer", args)
                             for m in args.model]}
    for m in result["models"]:
        turns = m["turns"]
        print(f"{m['model']}: written {m['write_s']} s, all {m['wall_s']} s; turn 20 ({turns[-1]['prompt_tokens']} "
              f"tokens, {turns[-1]['cached_tokens']} reused) TTFT {turns[-1]['ttft_ms_reuse']} ms vs "
              f"{turns[-1].get('ttft_ms_no_reuse')} ms without; from the host {m['resume_host']} ; after reopen "
              f"{m['resume_after_reopen']}; restore {m['host_restore_gb_per_s_estimate']} GB/s (pinned copy "
              f"{result['pinned_h2d_gb_per_s']} GB/s)")
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
