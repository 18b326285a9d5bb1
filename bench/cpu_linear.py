"""CPU linear() weight-streaming rate per encoding: GB/s of stored weight bytes (codes + scales) consumed per second,
at rows=1 (decode) and rows=4 (a small batch), on a SmolLM2-class 1536x576 matrix and a 4096x4096 one.

Run: .venv/bin/python bench/cpu_linear.py [--out bench/results/cpu_linear.json]. Not a test: figures depend on the
machine; bench/NOTES-cpu.md records them with the machine and commit.

--compare PATH,PATH (e.g. avx2,fast): instead, the Qwen2-0.5B shapes (gate/up 896 -> 4864, down 4864 -> 896, the
tied head 896 -> 151936) in the grouped-integer encodings, each call timed under every named linear() path in turn,
--repeats times round: on a shared machine only such alternating same-process pairs compare.
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
from ninfer import _engine, _testing
from ninfer.artifact.encodings import blob_specs
from ninfer.artifact.writer import ArtifactWriter, TensorPlan

SHAPES = {"1536x576": (1536, 576), "4096x4096": (4096, 4096)}
ENCODINGS = {"int4": 32, "int8": 32, "bf16": None, "fp8_e4m3": None, "nvfp4": None}
ROWS = (1, 4)
# (label, (out, cols), encoding, group) for --compare: a 0.5B Qwen2 token's matrices as the GGUF import stores them.
QWEN2_05B = [(label, shape, enc, 32) for label, shape in (("gate_up 896->4864", (4864, 896)),
                                                           ("down 4864->896", (896, 4864)))
             for enc in ("int4", "int8", "int4_affine")] + [("head 896->151936", (151936, 896), "int8", 32)]


def build(path: Path, plans: list[TensorPlan] | None = None) -> None:
    rng = np.random.default_rng(0)
    plans = plans or [TensorPlan(f"{enc}/{label}", shape, enc, group) for label, shape in SHAPES.items()
                      for enc, group in ENCODINGS.items()]
    with ArtifactWriter(path, config={}, tensors=plans, frontend={}, recipe={}, source={"kind": "synthetic"},
                        progress=False) as writer:
        for plan in plans:
            writer.write(plan.name, rng.standard_normal(plan.shape).astype(np.float32))


def stored_bytes(plan_shape: tuple[int, int], encoding: str, group: int | None) -> int:
    return sum(spec.nbytes for spec in blob_specs(encoding, plan_shape, group).values())


def time_linear(art, name: str, x: np.ndarray, out: np.ndarray, min_seconds: float = 0.5,
                path: str = "fast") -> tuple[float, float]:
    """Median wall seconds and median process-CPU seconds per call (after a warm-up call). On a shared machine
    the CPU time with OMP_NUM_THREADS=1 is the figure to trust: it leaves out the time other processes held the
    core (with more threads it also counts barrier spinning, so there the wall time is the one)."""
    _testing.kernels.linear(x, art, name, out=out, path=path)
    wall, cpu = [], []
    deadline = time.perf_counter() + min_seconds
    while time.perf_counter() < deadline or len(wall) < 5:
        start, start_cpu = time.perf_counter(), time.process_time()
        _testing.kernels.linear(x, art, name, out=out, path=path)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return float(np.median(wall)), float(np.median(cpu))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "cpu_linear.json")
    parser.add_argument("--compare", help="comma-separated linear() paths to alternate on the 0.5B shapes")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of the paths (--compare)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1], help="input rows (--compare)")
    args = parser.parse_args()
    results = compare(args.compare.split(","), args.repeats, args.rows) if args.compare else bench_all()
    write_record(args.out, results)


def bench_all() -> list[dict]:
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
    return results


def compare(paths: list[str], repeats: int, rows_list: list[int]) -> list[dict]:
    """Per matrix and rows, `repeats` rounds of every path in turn (0.3 s of calls each): per round and path the
    median wall and CPU microseconds per call, with the load average at that moment."""
    plans = [TensorPlan(f"{enc}-g{group}/{label}", shape, enc, group) for label, shape, enc, group in QWEN2_05B]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.ninfer"
        build(path, plans)
        with _engine.Artifact.open(path) as art:
            for plan in plans:
                for rows in rows_list:
                    x = np.random.default_rng(1).standard_normal((rows, plan.shape[1])).astype(np.float32)
                    out = np.empty((rows, plan.shape[0]), np.float32)
                    rounds = []
                    for _ in range(repeats):
                        for kernel_path in paths:
                            seconds, cpu_seconds = time_linear(art, plan.name, x, out, 0.3, kernel_path)
                            rounds.append({"path": kernel_path, "us_per_call": round(seconds * 1e6, 1),
                                           "cpu_us_per_call": round(cpu_seconds * 1e6, 1),
                                           "load_average_1m": os.getloadavg()[0]})
                    summary = {p: float(np.median([r["cpu_us_per_call"] for r in rounds if r["path"] == p]))
                               for p in paths}
                    best = {p: min(r["cpu_us_per_call"] for r in rounds if r["path"] == p) for p in paths}
                    results.append({"matrix": plan.name, "rows": rows, "weights": plan.shape[0] * plan.shape[1],
                                    "median_cpu_us": summary, "best_cpu_us": best, "rounds": rounds})
                    print(f"{plan.name:>28} rows={rows}  cpu us median " +
                          "  ".join(f"{p} {summary[p]:>9.1f} (best {best[p]:>9.1f})" for p in paths) +
                          f"  load {os.getloadavg()[0]:.1f}", flush=True)
    return results


def write_record(out: Path, results: list[dict]) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    record = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform(),
                          "load_average_1m": os.getloadavg()[0]},
              "threads": int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)),
              "commit": commit, "results": results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


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
