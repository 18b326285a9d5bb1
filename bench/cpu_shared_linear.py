"""A decode step's grouped projections on the CPU: every layer's q/k/v and gate/up of an artifact at rows = 1, as
separate linear() calls and as one linear_shared_input call per group (one rounding of x, one parallel region;
bench/NOTES-cpu.md, session 12), the two alternating in one process.

Run: .venv/bin/python bench/cpu_shared_linear.py [--artifact PATH] [--repeats N] [--out FILE]. Default artifact: the
embedded SmolLM2-135M-Instruct. Each repeat times all layers once (a token's worth of these projections) in each
form; the record holds the medians and bests in ms per token, and the 1-minute load before and after. Both forms
pay Python's call overhead per call (~1-2 us), the separate form for more calls. Not a test: figures depend on the
machine. A build without kernels.linear_shared_input (before session 12) records the separate form only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
from ninfer import _engine, _testing
from ninfer.default_model import default_model_path

GROUPS = {"qkv": ("attn.q_proj", "attn.k_proj", "attn.v_proj"), "gate_up": ("mlp.gate", "mlp.up")}


def layer_groups(art) -> list[tuple[str, list[str]]]:
    names = set(art.tensor_names())
    layers = sorted({int(n.split(".")[1]) for n in names if n.startswith("layers.")})
    return [(kind, [f"layers.{i}.{suffix}" for suffix in suffixes]) for i in layers
            for kind, suffixes in GROUPS.items() if all(f"layers.{i}.{s}" in names for s in suffixes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "cpu_shared_linear.json"))
    args = parser.parse_args()
    artifact = Path(args.artifact) if args.artifact else default_model_path()
    art = _engine.Artifact.open(str(artifact))
    groups = layer_groups(art)
    rng = np.random.default_rng(0)
    calls = []
    for kind, names in groups:
        cols = art.tensor_info(names[0])["shape"][1]
        x = rng.standard_normal((1, cols)).astype(np.float32)
        outs = [np.empty((1, art.tensor_info(n)["shape"][0]), np.float32) for n in names]
        calls.append((kind, names, x, outs))
    shared = getattr(_testing.kernels, "linear_shared_input", None)

    def separate() -> float:
        start = time.perf_counter()
        for _, names, x, outs in calls:
            for name, out in zip(names, outs, strict=True):
                _testing.kernels.linear(x, art, name, out=out)
        return time.perf_counter() - start

    def together() -> float:
        start = time.perf_counter()
        for _, names, x, outs in calls:
            shared(x, art, names, outs, [None] * len(names))
        return time.perf_counter() - start

    forms = {"separate": separate, **({"shared": together} if shared else {})}
    for form in forms.values():
        form()  # warm-up: page the weights in
    load_before = os.getloadavg()[0]
    times = {name: [] for name in forms}
    for _ in range(args.repeats):
        for name, form in forms.items():
            times[name].append(1e3 * form())
    load_after = os.getloadavg()[0]
    record = {
        "bench": "cpu_shared_linear", "artifact": artifact.name, "groups": len(groups), "threads": os.cpu_count(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"), "repeats": args.repeats,
        "load_avg_1m": [round(load_before, 2), round(load_after, 2)],
        "ms_per_token": {name: {"median": round(statistics.median(t), 3), "best": round(min(t), 3)}
                         for name, t in times.items()},
    }
    print(json.dumps(record))
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
