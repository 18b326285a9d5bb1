"""MTP speculative decoding on the CUDA backend at the real Qwen3.5 shapes (synthetic weights with an MTP head,
bench/synthetic.py): the device time of a verify pass of K + 1 rows per lane against a plain decode pass, at each
concurrency C, and the round time of the whole speculative loop.

Measured, per (K, C): the mean device time of a graph launch (CUDA events around each launch: decode passes with
K = 0, verify passes of K drafts otherwise), and the wall time of a round (drafting with the MTP head, the verify
pass, sampling and acceptance) from the requests' own decode timings. Random weights accept almost no draft, so a
round there emits one token; the decode speed at an acceptance length L (tokens a round emits) is then DERIVED as
L / round time, the round's cost barely depending on how many drafts it accepts (the MTP head's catch-up grows by
the accepted rows: a few rows of one layer).

--op-times runs every pass eagerly (no graphs) with the device time per backend op (EngineOptions.cuda_op_times):
each row then also has the ops' device time per round (drafting, verify pass, sampling), so that the round's wall
time minus it is what the host adds.

    python bench/cuda_speculative.py --model qwen3.5-27b --out bench/results/cuda_speculative_27b.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from cuda_engine import graph_pass_split, op_time_split, run_batch
from cuda_kernels import source_commit
from ninfer.engine import Engine, EngineOptions
from synthetic import MODELS, write_synthetic

ACCEPTANCE_LENGTHS = (2.5, 3.2)


def round_seconds(final) -> float:
    """A request's mean wall time per decode round: its decode time over its rounds (each round after the first
    token emits the accepted drafts plus one; plain decoding: one token a round)."""
    generated = final.usage.generated_tokens
    decode_s = (generated - 1) / final.timings.decode_tokens_per_s
    return decode_s / max(generated - 1 - final.timings.draft_n_accepted, 1)


def run_engine(path: Path, k: int, batches: list[int], prompt_len: int, new_tokens: int,
               op_times: bool = False) -> list[dict]:
    spec = {"spec": "mtp", "draft_tokens": k} if k else {}
    options = EngineOptions(backend="cuda", max_context=prompt_len + new_tokens + 64, max_concurrency=max(batches),
                            kv_capacity="auto", verify_checksums=False, cuda_op_times=op_times,
                            cuda_graphs=not op_times, **spec)
    rng = np.random.default_rng(0)
    rows = []
    with Engine.open_sync(path, options) as engine:
        for batch in batches:
            prompts = [rng.integers(0, 200000, prompt_len).tolist() for _ in range(batch)]
            asyncio.run(run_batch(engine, prompts, 2 * k + 4))  # warm-up: this shape's eager pass and capture
            before = engine.memory_plan()
            finals = asyncio.run(run_batch(engine, prompts, new_tokens))
            after = engine.memory_plan()
            passes = graph_pass_split(before, after)
            drafted = sum(f.timings.draft_n for f in finals)
            ops = {}
            if op_times:  # per round of one lane: the timed run's rounds over its lanes (prefill included)
                rounds = max(f.usage.generated_tokens - 1 - f.timings.draft_n_accepted for f in finals)
                ops = {op: {"calls": t["calls"] / rounds, "device_us": t["device_us"] / rounds}
                       for op, t in op_time_split(before["op_times"], after["op_times"]).items()}
            rows.append({"op_times_per_round": ops,
                         "device_ms_per_round": sum(t["device_us"] for t in ops.values()) / 1e3, "k": k, "batch": batch, "graph_pass_device_ms": passes["device"],
                         "graph_passes": passes["passes"], "graph_captures": passes["captures"],
                         "draft_graph_passes": passes["draft_passes"], "draft_graph_device_ms": passes["draft_device"],
                         "round_ms": 1e3 * float(np.median([round_seconds(f) for f in finals])),
                         "drafted": drafted, "accepted": sum(f.timings.draft_n_accepted for f in finals)})
    return rows


def derive(rows: list[dict]) -> list[dict]:
    """Each speculative row against the plain decode row of its concurrency: the verify pass's device time over
    the decode pass's, and the DERIVED decode speed per sequence at each acceptance length."""
    plain = {r["batch"]: r for r in rows if r["k"] == 0}
    out = []
    for r in rows:
        p = plain[r["batch"]]
        d = dict(r, plain_tokens_per_s=1e3 / p["round_ms"])
        if r["k"]:
            d["verify_over_decode_device"] = (r["graph_pass_device_ms"] / p["graph_pass_device_ms"]
                                              if p["graph_pass_device_ms"] else None)  # None: no graphs (--op-times)
            d["round_over_decode_round"] = r["round_ms"] / p["round_ms"]
            d["derived_tokens_per_s"] = {str(a): 1e3 * a / r["round_ms"] for a in ACCEPTANCE_LENGTHS}
            d["derived_speedup"] = {str(a): p["round_ms"] * a / r["round_ms"] for a in ACCEPTANCE_LENGTHS}
        out.append(d)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--recipe", default="groupwise-int")
    parser.add_argument("--drafts", type=int, nargs="*", default=[1, 2, 3, 4, 5])
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--op-times", action="store_true", help="eager passes with per-op device times (see above)")
    parser.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                        help="the artifact's drafts score an N-row lm-head shortlist (ninfer convert --draft-vocab)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        path = write_synthetic(args.model, args.recipe, Path(tmp) / f"{args.model}.ninfer", progress=False, mtp=True,
                               draft_vocab=args.draft_vocab)
        written_s = time.perf_counter() - started
        rows = []
        for k in [0, *args.drafts]:
            rows += run_engine(path, k, args.batches, args.prompt, args.new_tokens, args.op_times)
    from ninfer import _testing

    result = {"model": args.model, "recipe": args.recipe, "draft_vocab": args.draft_vocab,
              "device": _testing.cuda.device_name(),
              "commit": source_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "write_s": written_s,
              "prompt_tokens": args.prompt, "new_tokens": args.new_tokens, "rows": derive(rows),
              "note": "derived_* figures assume the acceptance length; random weights accept almost no draft"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{result['device']} {args.model} {args.recipe} (artifact written in {written_s:.0f} s)")
    for r in result["rows"]:
        line = (f"K={r['k']} C={r['batch']}: graph pass {r['graph_pass_device_ms']:.2f} ms device "
                f"({r['graph_passes']:.0f} launches), round {r['round_ms']:.2f} ms")
        if r["k"]:
            derived = ", ".join(f"L={a}: {v:.1f} tok/s/seq ({r['derived_speedup'][a]:.2f}x)"
                                for a, v in r["derived_tokens_per_s"].items())
            ratio = r["verify_over_decode_device"]
            line += (f"; verify/decode {ratio:.2f}x device" if ratio else "; no graphs")
            if r["draft_graph_passes"]:
                line += f"; drafting {r['draft_graph_device_ms']:.2f} ms device ({r['draft_graph_passes']:.0f} graph launches)"
            line += (f", round/decode "
                     f"{r['round_over_decode_round']:.2f}x; DERIVED {derived}; accepted {r['accepted']}/{r['drafted']}")
        print(line)
        if r["op_times_per_round"]:
            top = ", ".join(f"{op} {t['device_us']:.0f} us/{t['calls']:.1f}"
                            for op, t in list(r["op_times_per_round"].items())[:10])
            print(f"  per round: device {r['device_ms_per_round']:.2f} ms: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
