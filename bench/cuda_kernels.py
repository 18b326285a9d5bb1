"""Kernel-level benchmark of the CUDA decode GEMV and the gated-delta-rule decode step at Qwen3.5 shapes,
against the device read bandwidth measured in the same run, and of the device sampler at the Qwen3.5 vocabulary.
Run on the accelerator machine:

    python bench/cuda_kernels.py --out bench/results/cuda_kernels.json

Weights are random codes written straight into a synthetic artifact (speed does not depend on values). Each GEMV
is timed with CUDA events over several device copies of the weight used in turn, so every call streams from
device memory rather than L2.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from artifact_files import random_codes, write_artifact  # noqa: E402

from ninfer import _engine  # noqa: E402

# Qwen3.5-27B linear weights (out, in) and the lm_head; see reference section 8.
SHAPES_27B = {
    "q_proj": (12288, 5120),
    "o_proj": (5120, 6144),
    "in_proj_qkv": (10240, 5120),
    "mlp_gate": (17408, 5120),
    "mlp_down": (5120, 17408),
    "lm_head": (248320, 5120),
}
ENCODINGS = [("int4", 128), ("fp8_e4m3", None), ("nvfp4", None), ("bf16", None)]


def _median_seconds(fn, repeats: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1000)
    return float(np.median(times))


def measure_bandwidth() -> dict[str, float]:
    """Device bandwidth in bytes/s: a 4 GiB read-only reduction (the decode limit: weights are only read) and a
    2 GiB device-to-device copy (read + write counted)."""
    import torch

    n = 4 * 1024**3
    data = torch.empty(n // 4, dtype=torch.float32, device="cuda")
    data.uniform_(-1, 1)
    read = n / _median_seconds(lambda: data.sum())
    src = data[: n // 8]
    dst = torch.empty_like(src)
    copy = 2 * src.numel() * 4 / _median_seconds(lambda: dst.copy_(src))
    del data, dst
    torch.cuda.empty_cache()
    return {"read": read, "copy": copy}


def bench_gemv(workdir: Path, bandwidth: float) -> list[dict]:
    rng = np.random.default_rng(0)
    rows_out = []
    for encoding, group in ENCODINGS:
        tensors = {name: random_codes(rng, encoding, shape, group, nan_codes=False) for name, shape in SHAPES_27B.items()}
        path = write_artifact(workdir / f"gemv-{encoding}.ninfer", tensors)
        art = _engine.Artifact.open(path, verify_checksums=False)
        for name, (out, cols) in SHAPES_27B.items():
            copies = 2 if name == "lm_head" else 8
            for rows in (1, 2, 4, 8):
                micros, weight_bytes = _engine.cuda.bench_linear(art, name, rows, copies=copies, iterations=60)
                moved = weight_bytes + 4 * rows * (cols + out)
                rows_out.append({
                    "kernel": "gemv", "encoding": encoding, "group_size": group, "tensor": name, "shape": [out, cols],
                    "rows": rows, "median_us": micros, "bytes": moved, "gb_per_s": moved / micros / 1e3,
                    "fraction_of_bandwidth": moved / (micros * 1e-6) / bandwidth,
                })
        art.close()
        path.unlink()
    return rows_out


def bench_gdn_decode(bandwidth: float) -> list[dict]:
    hk, hv, dk, dv = 16, 48, 128, 128  # Qwen3.5-27B linear-attention layer
    rows_out = []
    for batch in (1, 2, 4, 8):
        micros, moved = _engine.cuda.bench_gdn_decode(batch, hk, hv, dk, dv, iterations=100)
        rows_out.append({"kernel": "gdn_decode", "batch": batch, "shape": [hk, hv, dk, dv], "median_us": micros,
                         "bytes": moved, "fraction_of_bandwidth": moved / (micros * 1e-6) / bandwidth})
    return rows_out


def bench_sampler() -> list[dict]:
    """One device-sampler call (pack, upload, kernels, download) at the Qwen3.5 vocabulary, greedy and nucleus."""
    vocab = 248320
    cases = {"greedy": dict(temperature=0.0), "top_p": dict(temperature=0.7, top_p=0.95),
             "top_k_top_p": dict(temperature=0.7, top_k=20, top_p=0.8), "temperature": dict(temperature=1.0)}
    rows_out = []
    for name, fields in cases.items():
        params = _engine.SamplingParams()
        for k, v in fields.items():
            setattr(params, k, v)
        for rows in (1, 8):
            micros = _engine.cuda.bench_sampler(rows, vocab, params, iterations=100)
            rows_out.append({"kernel": "sampler", "case": name, "params": fields, "rows": rows, "vocab": vocab,
                             "median_us": micros})
    return rows_out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    measured = measure_bandwidth()
    bandwidth = measured["read"]
    with tempfile.TemporaryDirectory() as tmp:
        gemv = bench_gemv(Path(tmp), bandwidth)
    gdn = bench_gdn_decode(bandwidth)
    sampler = bench_sampler()
    result = {
        "device": _engine.cuda.device_name(), "host": platform.node(),
        "commit": commit.stdout.strip() or "unknown", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "measured_read_gb_per_s": measured["read"] / 1e9, "measured_copy_gb_per_s": measured["copy"] / 1e9, "gemv": gemv, "gdn_decode": gdn,
        "sampler": sampler,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"device {result['device']}: read {measured['read'] / 1e9:.0f} GB/s, copy {measured['copy'] / 1e9:.0f} GB/s")
    print(f"{'encoding':10} {'tensor':12} {'rows':>4} {'us':>9} {'GB/s':>7} {'of BW':>6}")
    for r in gemv:
        print(f"{r['encoding']:10} {r['tensor']:12} {r['rows']:>4} {r['median_us']:9.1f} {r['gb_per_s']:7.0f} "
              f"{r['fraction_of_bandwidth']:6.1%}")
    for r in gdn:
        print(f"gdn_decode batch {r['batch']}: {r['median_us']:.1f} us, {r['fraction_of_bandwidth']:.1%} of read BW")
    for r in sampler:
        print(f"sampler {r['case']:12} rows {r['rows']}: {r['median_us']:.1f} us (vocab {r['vocab']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
