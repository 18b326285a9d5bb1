"""CPU linear() weight-streaming rate per encoding: GB/s of stored weight bytes (codes + scales) consumed per second,
at rows=1 (decode) and rows=4 (a small batch), on a SmolLM2-class 1536x576 matrix and a 4096x4096 one.

Run: .venv/bin/python bench/cpu_linear.py [--out bench/results/cpu_linear.json]. Not a test: figures depend on the
machine; bench/NOTES-cpu.md records them with the machine and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from ninfer import _engine
from ninfer.artifact.encodings import blob_specs
from ninfer.artifact.writer import ArtifactWriter, TensorPlan

SHAPES = {"1536x576": (1536, 576), "4096x4096": (4096, 4096)}
ENCODINGS = {"int4": 32, "int8": 32, "bf16": None, "fp8_e4m3": None, "nvfp4": None}
ROWS = (1, 4)


def build(path: Path) -> None:
    rng = np.random.default_rng(0)
    plans = [TensorPlan(f"{enc}/{label}", shape, enc, group) for label, shape in SHAPES.items()
             for enc, group in ENCODINGS.items()]
    with ArtifactWriter(path, config={}, tensors=plans, frontend={}, recipe={}, source={"kind": "synthetic"},
                        progress=False) as writer:
        for plan in plans:
            writer.write(plan.name, rng.standard_normal(plan.shape).astype(np.float32))


def stored_bytes(plan_shape: tuple[int, int], encoding: str, group: int | None) -> int:
    return sum(spec.nbytes for spec in blob_specs(encoding, plan_shape, group).values())


def time_linear(art, name: str, x: np.ndarray, out: np.ndarray, min_seconds: float = 0.5) -> tuple[float, float]:
    """Median wall seconds and median process-CPU seconds per call (after a warm-up call). On a shared machine
    the CPU time with OMP_NUM_THREADS=1 is the figure to trust: it leaves out the time other processes held the
    core (with more threads it also counts barrier spinning, so there the wall time is the one)."""
    _engine.kernels.linear(x, art, name, out=out)
    wall, cpu = [], []
    deadline = time.perf_counter() + min_seconds
    while time.perf_counter() < deadline or len(wall) < 5:
        start, start_cpu = time.perf_counter(), time.process_time()
        _engine.kernels.linear(x, art, name, out=out)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return float(np.median(wall)), float(np.median(cpu))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "cpu_linear.json")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.ninfer"
        build(path)
        with _engine.Artifact.open(path) as art:
            for label, shape in SHAPES.items():
                for enc, group in ENCODINGS.items():
                    name = f"{enc}/{label}"
                    nbytes = stored_bytes(shape, enc, group)
                    for rows in ROWS:
                        x = np.random.default_rng(1).standard_normal((rows, shape[1])).astype(np.float32)
                        out = np.empty((rows, shape[0]), np.float32)
                        seconds, cpu_seconds = time_linear(art, name, x, out)
                        row = {"matrix": label, "encoding": enc, "group_size": group, "rows": rows,
                               "weight_bytes": nbytes, "us_per_call": round(seconds * 1e6, 1),
                               "weight_GBps": round(nbytes / seconds / 1e9, 2),
                               "cpu_us_per_call": round(cpu_seconds * 1e6, 1),
                               "weight_GBps_per_cpu_second": round(nbytes / cpu_seconds / 1e9, 2),
                               "GFLOPs": round(2 * rows * shape[0] * shape[1] / seconds / 1e9, 2)}
                        results.append(row)
                        print(f"{label:>10} {enc:>9} rows={rows}  {row['us_per_call']:>9.1f} us "
                              f"{row['weight_GBps']:>6.2f} GB/s  |  cpu {row['cpu_us_per_call']:>9.1f} us "
                              f"{row['weight_GBps_per_cpu_second']:>6.2f} GB/s")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    record = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform(),
                          "load_average_1m": os.getloadavg()[0]},
              "threads": int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)),
              "commit": commit, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
