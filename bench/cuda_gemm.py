"""Prefill GEMM benchmark: TFLOP/s of the CUDA backend's prefill linear layers (`_engine.cuda.bench_gemm`, the
path the backend picks: W8A8 e4m3 for fp8 weights, bf16 after dequantization for the others; activation
rounding and dequantization included) at M = 1024 and 8192 rows for the Qwen3.5-27B layer shapes, next to what
PyTorch's cuBLAS reaches for a plain bf16 matmul and an fp8 rowwise-scaled matmul of the same shape, measured in the
same run. Called by bench/cuda_kernels.py (`--only gemm` or by default); also runs alone:

    python bench/cuda_gemm.py --out bench/results/cuda_gemm.json

`--streamed` instead times the streamed int4/int8 GEMM (no bf16 copy of W) against the bf16 path at the few-row
counts of verify passes, decision batches and short prefill chunks, with each time as a fraction of its limit
(the weights read once at the measured read bandwidth, or the bf16 dense matrix rate, whichever is longer).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from artifact_files import random_codes, write_artifact
from ninfer import _engine

ROWS = (1024, 8192)
ENCODINGS = [("bf16", None), ("fp8_e4m3", None), ("int4", 128), ("nvfp4", None)]
# fp8 weights also through the bf16 path (W8A16), to show what W8A8 gains.
EXTRA_IMPLS = {"fp8_e4m3": ("auto", "bf16")}
# The prefill runs every layer's linear weights over all prompt rows; the lm_head only over the last ones.
LAYER_SHAPES = ("q_proj", "o_proj", "in_proj_qkv", "mlp_gate", "mlp_down")


def _torch_tflops(m: int, n: int, k: int, median_seconds: Callable) -> dict[str, float | None]:
    """TFLOP/s of torch's bf16 matmul and (where this torch has it) fp8 _scaled_mm with rowwise scales."""
    import torch

    flop = 2.0 * m * n * k
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    out = {"torch_bf16": flop / median_seconds(lambda: x @ w.T, repeats=10) / 1e12, "torch_fp8_rowwise": None}
    try:
        x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        sx = torch.ones(m, 1, device="cuda", dtype=torch.float32)
        sw = torch.ones(1, n, device="cuda", dtype=torch.float32)
        out["torch_fp8_rowwise"] = flop / median_seconds(
            lambda: torch._scaled_mm(x8, w8.T, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16), repeats=10) / 1e12
    except (RuntimeError, AttributeError, TypeError):
        pass  # this torch or device has no rowwise fp8 matmul
    return out


def bench_prefill_gemm(workdir: Path, shapes: dict[str, tuple[int, int]], median_seconds: Callable) -> list[dict]:
    """One row per (encoding, layer shape, M); `median_seconds(fn, repeats)` times the torch baselines."""
    rng = np.random.default_rng(0)
    results = []
    baselines = {(name, m): _torch_tflops(m, *shapes[name], median_seconds) for name in LAYER_SHAPES for m in ROWS}
    for encoding, group in ENCODINGS:
        tensors = {name: random_codes(rng, encoding, shapes[name], group, nan_codes=False) for name in LAYER_SHAPES}
        path = write_artifact(workdir / f"gemm-{encoding}.ninfer", tensors)
        art = _engine.Artifact.open(path, verify_checksums=False)
        for name in LAYER_SHAPES:
            n, k = shapes[name]
            for m in ROWS:
                for requested in EXTRA_IMPLS.get(encoding, ("auto",)):
                    micros, impl = _engine.cuda.bench_gemm(art, name, m, requested, iterations=10)
                    tflops = 2.0 * m * n * k / (micros * 1e-6) / 1e12
                    results.append({"kernel": "prefill_gemm", "encoding": encoding, "group_size": group,
                                    "tensor": name, "shape": [n, k], "rows": m, "impl": impl, "median_us": micros,
                                    "tflops": tflops, **baselines[(name, m)]})
        art.close()
        path.unlink()
    return results


STREAMED_ROWS = (9, 16, 32, 48, 64, 128, 256, 512, 1024)
STREAMED_ENCODINGS = [("int4", 128), ("int8", 128)]
READ_BANDWIDTH = 4.3e12  # H200, measured read bandwidth (bench/NOTES-cuda.md)
BF16_DENSE_FLOPS = 989e12  # H200 bf16 dense tensor rate (NVIDIA's figure)


def bench_streamed_gemm(workdir: Path, shapes: dict[str, tuple[int, int]]) -> list[dict]:
    """One row per (encoding, layer shape, rows, implementation): streamed and bf16."""
    rng = np.random.default_rng(0)
    results = []
    for encoding, group in STREAMED_ENCODINGS:
        tensors = {name: random_codes(rng, encoding, shapes[name], group, nan_codes=False) for name in LAYER_SHAPES}
        path = write_artifact(workdir / f"streamed-{encoding}.ninfer", tensors)
        art = _engine.Artifact.open(path, verify_checksums=False)
        for name in LAYER_SHAPES:
            n, k = shapes[name]
            weight_bytes = n * k * (4 if encoding == "int4" else 8) / 8 + n * (k // group) * 3  # codes, scale, zero
            for m in STREAMED_ROWS:
                limit_us = max(weight_bytes / READ_BANDWIDTH, 2.0 * m * n * k / BF16_DENSE_FLOPS) * 1e6
                for requested in ("streamed", "bf16"):
                    micros, impl = _engine.cuda.bench_gemm(art, name, m, requested, iterations=10)
                    results.append({"kernel": "prefill_gemm", "encoding": encoding, "group_size": group,
                                    "tensor": name, "shape": [n, k], "rows": m, "impl": impl, "median_us": micros,
                                    "weight_gbps": weight_bytes / (micros * 1e-6) / 1e9,
                                    "tflops": 2.0 * m * n * k / (micros * 1e-6) / 1e12,
                                    "limit_us": limit_us, "fraction_of_limit": limit_us / micros})
        art.close()
        path.unlink()
    return results


def print_streamed_table(results: list[dict]) -> None:
    print(f"{'encoding':9} {'tensor':12} {'rows':>5} {'impl':9} {'us':>8} {'GB/s':>7} {'TFLOP/s':>8} {'of limit':>8}")
    for r in results:
        print(f"{r['encoding']:9} {r['tensor']:12} {r['rows']:>5} {r['impl']:9} {r['median_us']:8.1f} "
              f"{r['weight_gbps']:7.0f} {r['tflops']:8.1f} {r['fraction_of_limit']:8.0%}")


def print_table(results: list[dict]) -> None:
    print(f"{'encoding':9} {'tensor':12} {'rows':>5} {'impl':21} {'us':>8} {'TFLOP/s':>8} {'torch bf16':>10} "
          f"{'torch fp8':>9}")
    for r in results:
        fp8 = r["torch_fp8_rowwise"]
        print(f"{r['encoding']:9} {r['tensor']:12} {r['rows']:>5} {r['impl']:21} {r['median_us']:8.0f} "
              f"{r['tflops']:8.0f} {r['torch_bf16']:10.0f} {'-' if fp8 is None else f'{fp8:9.0f}':>9}")


def main() -> int:
    import tempfile

    from cuda_kernels import SHAPES_27B, _median_seconds

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--streamed", action="store_true",
                        help="time the streamed int4/int8 GEMM against the bf16 path at few rows instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.streamed:
            results = bench_streamed_gemm(Path(tmp), SHAPES_27B)
        else:
            results = bench_prefill_gemm(Path(tmp), SHAPES_27B, _median_seconds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": _engine.cuda.device_name(), "prefill_gemm": results}, indent=1))
    (print_streamed_table if args.streamed else print_table)(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
