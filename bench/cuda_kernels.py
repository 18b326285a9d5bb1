"""Kernel-level benchmark of the CUDA decode GEMV, the gated-delta-rule decode step and chunked prefill, the prefill
row ops (GDN conv, alone and fused with its split, fused residual add + RMSNorm, SwiGLU), paged attention, the
prefill GEMM (bench/cuda_gemm.py), the device sampler and the MoE routed experts at Qwen3.5 shapes, against the
device read bandwidth measured in the same run (the f32 FMA rate for the GDN prefill, the dense bf16 matrix rate for
prefill attention and the MoE prefill, TFLOP/s for the GEMM). Run on the accelerator machine:

    python bench/cuda_kernels.py --out bench/results/cuda_kernels.json [--only attention rowops]

Weights are random codes written straight into a synthetic artifact (speed does not depend on values). Each GEMV
is timed with CUDA events over several device copies of the weight used in turn, so every call streams from
device memory rather than L2.
"""

from __future__ import annotations

import argparse
import json
import os
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
from ninfer import _engine, _testing  # noqa: E402
from ninfer.engine import KV_DTYPES  # noqa: E402

# Qwen3.5-27B linear weights (out, in) and the lm_head; see reference section 8.
SHAPES_27B = {
    "q_proj": (12288, 5120),
    "o_proj": (5120, 6144),
    "in_proj_qkv": (10240, 5120),
    "mlp_gate": (17408, 5120),
    "mlp_down": (5120, 17408),
    "lm_head": (248320, 5120),
}
# Qwen3.5-35B-A3B's dense decode GEMVs (the routed experts run in bench_moe): widths 2048 and 4096, small launches
# where per-call costs (the activation split among them) weigh most.
SHAPES_35B_A3B = {
    "gdn_in_qkv": (8192, 2048),
    "gdn_in_z": (4096, 2048),
    "gdn_out_proj": (2048, 4096),
    "attn_k_proj": (512, 2048),
    "shared_gate": (512, 2048),
    "shared_down": (2048, 512),
    "lm_head": (248320, 2048),
}
GEMV_SHAPES = {"27b": SHAPES_27B, "35b-a3b": SHAPES_35B_A3B}
ENCODINGS = [("int4", 128), ("fp8_e4m3", None), ("nvfp4", None), ("bf16", None)]


def encoding_arg(text: str) -> tuple[str, int | None]:
    """'int8:64' -> ("int8", 64); 'bf16' -> ("bf16", None): an encoding and its group size."""
    name, _, group = text.partition(":")
    return name, int(group) if group else None


def source_commit() -> str:
    """The commit the tree was at: NINFER_COMMIT when set (the device tool copies the working tree, whose .git may
    lag behind), else git."""
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return os.environ.get("NINFER_COMMIT") or git.stdout.strip() or "unknown"


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


# Tensor cores (v5), the previous tensor-core kernel (v3), the CUDA-core twin; and (not run by default) v5 reading
# the split kernel's planes for bf16 too, the twin of its in-register bf16 split.
GEMV_IMPLS = ("mma", "mma_v3", "simt")
GEMV_IMPL_CHOICES = (*GEMV_IMPLS, "mma_planes")


DENSE_BF16_FLOPS = 790e12  # H200 dense bf16 matrix rate (issue 5)


def byte_rate(moved: float, micros: float, bandwidth: float) -> dict[str, float]:
    """A kernel's bytes per second, and that over the measured read bandwidth."""
    return {"gb_per_s": moved / micros / 1e3, "fraction_of_bandwidth": moved / (micros * 1e-6) / bandwidth}


def flop_rate(flops: float, micros: float) -> dict[str, float]:
    """A kernel's TFLOP/s, and that over the device's dense bf16 matrix rate."""
    return {"tflop_per_s": flops / micros / 1e6, "fraction_of_bf16_peak": flops / (micros * 1e-6) / DENSE_BF16_FLOPS}


def bench_gemv(workdir: Path, bandwidth: float, impls: tuple[str, ...] = GEMV_IMPLS,
               shapes: dict[str, tuple[int, int]] = SHAPES_27B,
               encodings: list[tuple[str, int | None]] = ENCODINGS) -> list[dict]:
    """Each GEMV is one graph of calls cycling over device copies of the weight (no host gaps, as in a captured
    decode pass). Every call splits its activations itself ("own" split: the cost of a lone weight), and the
    tensor-core impls run again with one split shared by the calls ("shared": as a layer's projections that share
    their input run, and close to the GEMV kernel alone)."""
    rng = np.random.default_rng(0)
    rows_out = []
    for encoding, group in encodings:
        tensors = {name: random_codes(rng, encoding, shape, group, nan_codes=False) for name, shape in shapes.items()}
        path = write_artifact(workdir / f"gemv-{encoding}.ninfer", tensors)
        art = _engine.Artifact.open(path, verify_checksums=False)
        for name, (out, cols) in shapes.items():
            copies = 2 if name == "lm_head" else 8
            for impl in impls:
                for split in ("own", "shared") if impl.startswith("mma") else ("own",):
                    for rows in (1, 2, 4, 8):
                        micros, weight_bytes = _testing.cuda.bench_linear(
                            art, name, rows, copies=copies, iterations=60, impl=impl, shared_split=split == "shared")
                        moved = weight_bytes + 4 * rows * (cols + out)
                        rows_out.append({
                            "kernel": "gemv", "impl": impl, "split": split, "encoding": encoding, "group_size": group,
                            "tensor": name, "shape": [out, cols], "rows": rows, "median_us": micros, "bytes": moved,
                            **byte_rate(moved, micros, bandwidth),
                        })
        art.close()
        path.unlink()
    return rows_out


def print_gemv(rows: list[dict]) -> None:
    """One line per (encoding, tensor, rows): each kernel's microseconds per call and fraction of read bandwidth;
    "impl*" is the tensor-core impl with one activation split shared by the calls."""
    columns: list[str] = []
    table: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        column = r["impl"] + ("*" if r["split"] == "shared" else "")
        if column not in columns:
            columns.append(column)
        table.setdefault((r["encoding"], r["tensor"], r["rows"]), {})[column] = r
    print("decode GEMV, us per call and fraction of read bandwidth (impl*: one activation split for all calls)")
    header = " ".join(f"{column:>16} {'of BW':>6}" for column in columns)
    print(f"{'encoding':10} {'tensor':12} {'rows':>4} {header}")
    for (encoding, tensor, n), by_column in table.items():
        cells = [f"{by_column[c]['median_us']:16.1f} {by_column[c]['fraction_of_bandwidth']:6.1%}" if c in by_column
                 else f"{'':16} {'':6}" for c in columns]
        print(f"{encoding:10} {tensor:12} {n:>4} " + " ".join(cells))


def bench_gdn_decode(bandwidth: float) -> list[dict]:
    hk, hv, dk, dv = 16, 48, 128, 128  # Qwen3.5-27B linear-attention layer
    rows_out = []
    for batch in (1, 2, 4, 8):
        micros, moved = _testing.cuda.bench_gdn_decode(batch, hk, hv, dk, dv, iterations=100)
        rows_out.append({"kernel": "gdn_decode", "batch": batch, "shape": [hk, hv, dk, dv], "median_us": micros,
                         "bytes": moved, "fraction_of_bandwidth": moved / (micros * 1e-6) / bandwidth})
    return rows_out


# H200 SXM f32 rate on the CUDA cores: 132 SMs x 128 FMA lanes x 2 FLOP x 1.98 GHz (maximum boost clock).
F32_FLOPS = 132 * 128 * 2 * 1.98e9


# H200 SXM dense tf32 tensor-core rate (NVIDIA's datasheet: 989 TFLOP/s with 2:4 sparsity, half of it dense).
TF32_FLOPS = 494.7e12


def gdn_chunked_flops(tokens: int, hv: int, dk: int, dv: int, chunk: int = 64) -> tuple[float, float]:
    """(prepare, scan) FLOPs of the chunked form as gdn_prefill.cu computes it, per (chunk, value head) of L rows.
    Prepare (f32 CUDA cores): k.k and q.k (full L x L squares, 2 * 2 L^2 Dk) and the forward substitution over
    Dk + Dv columns ((Dk + Dv) L (L - 1)). Scan (tensor cores): W S and Q S (2 * 2 L Dk Dv), P u (L (L + 1) Dv)
    and the state update (2 L Dk Dv)."""
    prepare = scan = 0.0
    for start in range(0, tokens, chunk):
        n = min(chunk, tokens - start)
        prepare += 4 * n * n * dk + (dk + dv) * n * (n - 1)
        scan += 6 * n * dk * dv + n * (n + 1) * dv
    return prepare * hv, scan * hv


def bench_gdn_prefill(bandwidth: float) -> list[dict]:
    """The delta rule over one sequence of 512 (the engine's default prefill chunk), 1k and 8k new tokens at the
    27B shape (kernels only), against its limits: FLOPs over the rates they run at (prepare: f32 CUDA cores;
    scan: dense tf32 tensor cores), and the bytes that must move (q, k, v, g, beta in; out; the state in and out)
    over the read bandwidth. The workspace (written once, read back by the scan) is listed apart. Timed: the
    chunked form with the tensor-core scan, its prepare kernel alone (so the scan is the difference), and the
    chunked form with the f32 scan (the twin)."""
    hk, hv, dk, dv = 16, 48, 128, 128
    rows_out = []
    for tokens in (512, 1024, 8192):
        timed = {impl: _testing.cuda.bench_gdn_prefill(tokens, hk, hv, dk, dv, iterations=10, impl=impl)
                for impl in ("mma", "prepare", "f32")}
        micros, workspace = timed["mma"]
        prepare_flops, scan_flops = gdn_chunked_flops(tokens, hv, dk, dv)
        flops = prepare_flops + scan_flops
        io = 4 * (tokens * (2 * hk * dk + 2 * hv * dv + 2 * hv) + 2 * hv * dk * dv)
        row = {"kernel": "gdn_prefill_chunked", "tokens": tokens, "shape": [hk, hv, dk, dv], "median_us": micros,
               "prepare_us": timed["prepare"][0], "scan_us": micros - timed["prepare"][0],
               "f32_scan_total_us": timed["f32"][0], "flops": flops, "tflop_per_s": flops / micros / 1e6,
               "flop_limit_us": (prepare_flops / F32_FLOPS + scan_flops / TF32_FLOPS) * 1e6,
               "io_bytes": io, "io_limit_us": io / bandwidth * 1e6, "workspace_bytes": workspace,
               "workspace_limit_us": 2 * workspace / bandwidth * 1e6, "tokens_per_s": tokens / micros * 1e6}
        if tokens == 1024:
            row["sequential_twin_us"], _ = _testing.cuda.bench_gdn_prefill(tokens, hk, hv, dk, dv, iterations=3,
                                                                          impl="sequential")
        rows_out.append(row)
    return rows_out


ROW_OPS = ["gdn_conv", "gdn_conv_qkv", "add_rmsnorm", "add_then_rmsnorm", "swiglu"]


def bench_row_ops(bandwidth: float) -> list[dict]:
    """The memory-bound prefill ops at the 27B shape over 512 and 8192 rows (one CudaBackend call each, op tables
    included): time against the bytes their contract must move over the measured read bandwidth. add_then_rmsnorm
    is the pair of ops that add_rmsnorm replaces in the model."""
    rows_out = []
    for rows in (512, 8192):
        for op in ROW_OPS:
            micros, moved = _testing.cuda.bench_prefill_op(op, rows, iterations=20)
            rows_out.append({"op": op, "rows": rows, "median_us": micros, "bytes": moved,
                             **byte_rate(moved, micros, bandwidth)})
    return rows_out


def print_row_ops(rows: list[dict]) -> None:
    if rows:
        print(f"{'row op (27B shape)':18} {'rows':>5} {'us':>9} {'GB/s':>7} {'of BW':>6}")
    for r in rows:
        print(f"{r['op']:18} {r['rows']:>5} {r['median_us']:9.1f} {r['gb_per_s']:7.0f} "
              f"{r['fraction_of_bandwidth']:6.1%}")


ATTENTION_27B = {"heads": 24, "kv_heads": 4, "head_dim": 256}  # Qwen3.5-27B full-attention layer
# Qwen3.5-35B-A3B's (1 row x 2 KV heads: 128 splits, nearly all empty at a chat's first turns: ctx 130).
ATTENTION_35B_A3B = {"heads": 16, "kv_heads": 2, "head_dim": 256}
DECODE_ATTENTION = [("27B", ATTENTION_27B, (1024, 8192, 32768)), ("35B-A3B", ATTENTION_35B_A3B, (130, 1024, 8192))]
L2_BYTES = 50 * 2**20


def bench_attention(bandwidth: float, kv_dtypes: list[str]) -> list[dict]:
    """Prefill attention (one prompt of P tokens attending causally to itself: 4 * head_dim * heads * P(P+1)/2
    FLOPs) against the dense bf16 rate, and decode attention (batch B, one new row each over a context of C
    keys) against the read bandwidth: the K/V bytes of the pool each call must read (codes and their scales),
    for each of `kv_dtypes`."""
    rows_out = []
    for kv_dtype in kv_dtypes:
        for prompt in (1024, 8192, 32768):
            calls = 2 if prompt > 8192 else 10
            micros, _ = _testing.cuda.bench_attention(**ATTENTION_27B, kv_dtype=kv_dtype, context=prompt,
                                                     new_rows=prompt, batch=1, calls=calls, iterations=5)
            flops = 4 * ATTENTION_27B["head_dim"] * ATTENTION_27B["heads"] * prompt * (prompt + 1) / 2
            rows_out.append({"kernel": "attention_prefill", "kv_dtype": kv_dtype, "prompt": prompt,
                             "median_us": micros, **flop_rate(flops, micros)})
        for layer, shape, contexts in DECODE_ATTENTION:
            for context, batch in ((c, b) for c in contexts for b in (1, 8)):
                micros, kv_bytes = _testing.cuda.bench_attention(
                    **shape, kv_dtype=kv_dtype, context=context, new_rows=1, batch=batch, calls=20, iterations=20)
                rows_out.append({"kernel": "attention_decode", "layer": layer, "kv_dtype": kv_dtype,
                                 "context": context, "batch": batch, "median_us": micros, "bytes": kv_bytes,
                                 **byte_rate(kv_bytes, micros, bandwidth), "fits_in_l2": kv_bytes < L2_BYTES})
    return rows_out


def print_attention(rows: list[dict]) -> None:
    print(f"{'attention prefill (27B layer)':32} {'kv':5} {'prompt':>6} {'us':>10} {'TFLOP/s':>8} "
          f"{'of bf16':>8}")
    for r in (r for r in rows if r["kernel"] == "attention_prefill"):
        print(f"{'':32} {r['kv_dtype']:5} {r['prompt']:>6} {r['median_us']:10.1f} {r['tflop_per_s']:8.1f} "
              f"{r['fraction_of_bf16_peak']:8.1%}")
    print(f"{'attention decode (layer)':32} {'kv':5} {'ctx':>6} {'batch':>5} {'us':>9} {'GB/s':>7} "
          f"{'of BW':>6}")
    for r in (r for r in rows if r["kernel"] == "attention_decode"):
        note = "  (KV fits in L2)" if r["fits_in_l2"] else ""
        print(f"{r['layer']:32} {r['kv_dtype']:5} {r['context']:>6} {r['batch']:>5} {r['median_us']:9.1f} "
              f"{r['gb_per_s']:7.0f} {r['fraction_of_bandwidth']:6.1%}{note}")


# Qwen3.5-35B-A3B routed experts (reference section 8): 256 experts, top-8, hidden 2048, expert width 512.
MOE_35B_A3B = {"experts": 256, "top_k": 8, "hidden": 2048, "inter": 512}
MOE_ENCODINGS = [("int4", 128), ("int8", 128), ("fp8_e4m3", None), ("nvfp4", None), ("bf16", None)]


def bench_moe(workdir: Path, bandwidth: float) -> list[dict]:
    """CudaBackend::moe_experts at the 35B-A3B shape on uniform random routings (the bench_moe binding): decode
    (rows 1, 8) against the read bandwidth (bytes: the distinct routed experts' weights with their scales, x and
    the output), prefill (rows 1024, 8192) against the dense bf16 rate (FLOPs: 2 * rows * top_k * 3 * hidden *
    inter; the grouped kernel multiplies each weight by x's bf16 hi and lo planes, so it issues twice these) and
    the simple twin at decode rows for comparison."""
    m = MOE_35B_A3B
    e, k, h, i = m["experts"], m["top_k"], m["hidden"], m["inter"]
    rng = np.random.default_rng(0)
    rows_out = []
    for encoding, group in MOE_ENCODINGS:
        tensors = {"gate": random_codes(rng, encoding, (e, i, h), group, nan_codes=False),
                   "up": random_codes(rng, encoding, (e, i, h), group, nan_codes=False),
                   "down": random_codes(rng, encoding, (e, h, i), group, nan_codes=False)}
        path = write_artifact(workdir / f"moe-{encoding}.ninfer", tensors)
        art = _engine.Artifact.open(path, verify_checksums=False)
        for impl, rows in [("grouped", 1), ("grouped", 8), ("reference", 1), ("reference", 8), ("grouped", 1024),
                           ("grouped", 8192)]:
            prefill = rows > 8
            # Decode calls touch 13-360 MB: two weight copies keep a recent call's experts from being L2 hits.
            micros, weight_bytes = _testing.cuda.bench_moe(art, "gate", "up", "down", rows, k,
                                                          copies=1 if prefill else 2,
                                                          calls=2 if prefill else 16, iterations=3 if prefill else 20,
                                                          impl=impl)
            moved = weight_bytes + 2 * 4 * rows * h
            flops = 2.0 * rows * k * 3 * h * i
            rows_out.append({
                "kernel": "moe_experts", "impl": impl, "encoding": encoding, "group_size": group, "rows": rows,
                "shape": m, "median_us": micros, "bytes": moved, **byte_rate(moved, micros, bandwidth),
                "flops": flops, **flop_rate(flops, micros),
            })
        art.close()
        path.unlink()
    return rows_out


def print_moe(rows: list[dict]) -> None:
    print(f"{'moe_experts (35B-A3B: 256 x top-8, 2048 x 512)':48} {'impl':9} {'rows':>5} {'us':>9} {'GB/s':>7} "
          f"{'of BW':>6} {'TFLOP/s':>8} {'of bf16':>8}")
    for r in rows:
        print(f"{r['encoding']:48} {r['impl']:9} {r['rows']:>5} {r['median_us']:9.1f} {r['gb_per_s']:7.0f} "
              f"{r['fraction_of_bandwidth']:6.1%} {r['tflop_per_s']:8.1f} {r['fraction_of_bf16_peak']:8.1%}")


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
            micros = _testing.cuda.bench_sampler(rows, vocab, params, iterations=100)
            rows_out.append({"kernel": "sampler", "case": name, "params": fields, "rows": rows, "vocab": vocab,
                             "median_us": micros})
    return rows_out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    families = ["gemv", "gdn", "rowops", "attention", "gemm", "sampler", "moe"]
    parser.add_argument("--only", nargs="+", choices=families, help="run these kernel families (default: all)")
    parser.add_argument("--gemv-impls", nargs="+", choices=GEMV_IMPL_CHOICES, default=list(GEMV_IMPLS),
                        help="decode GEMV kernels to time")
    parser.add_argument("--gemv-shapes", choices=sorted(GEMV_SHAPES), default="27b",
                        help="the model whose decode GEMV shapes to time")
    parser.add_argument("--gemv-encodings", nargs="+", type=encoding_arg, default=ENCODINGS,
                        help="decode GEMV encodings as NAME[:GROUP], e.g. int8:64 (the groupwise-int lm_head)")
    parser.add_argument("--gemv-tensors", nargs="+", help="time only these tensors of the shapes (default: all)")
    parser.add_argument("--kv-dtypes", nargs="+", choices=[d for d in KV_DTYPES if d != "f32"],
                        default=["bf16", "fp8"], help="KV formats of the attention benchmarks (default: bf16 fp8)")
    args = parser.parse_args()
    run = {name: args.only is None or name in args.only for name in families}
    commit = source_commit()
    measured = measure_bandwidth()
    bandwidth = measured["read"]
    gemv, gdn, prefill, row_ops, attention, prefill_gemm, sampler, moe = [], [], [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        if run["gemv"]:
            shapes = {name: shape for name, shape in GEMV_SHAPES[args.gemv_shapes].items()
                      if args.gemv_tensors is None or name in args.gemv_tensors}
            gemv = bench_gemv(Path(tmp), bandwidth, tuple(args.gemv_impls), shapes, args.gemv_encodings)
        if run["moe"]:
            moe = bench_moe(Path(tmp), bandwidth)
        if run["gemm"]:
            from cuda_gemm import bench_prefill_gemm

            prefill_gemm = bench_prefill_gemm(Path(tmp), SHAPES_27B, _median_seconds)
    if run["gdn"]:
        gdn = bench_gdn_decode(bandwidth)
        prefill = bench_gdn_prefill(bandwidth)
    if run["rowops"]:
        row_ops = bench_row_ops(bandwidth)
    if run["attention"]:
        attention = bench_attention(bandwidth, args.kv_dtypes)
    if run["sampler"]:
        sampler = bench_sampler()
    result = {
        "device": _testing.cuda.device_name(), "host": platform.node(),
        "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "measured_read_gb_per_s": measured["read"] / 1e9, "measured_copy_gb_per_s": measured["copy"] / 1e9, "gemv": gemv, "gdn_decode": gdn,
        "gdn_prefill": prefill, "row_ops": row_ops, "f32_flops": F32_FLOPS, "tf32_flops": TF32_FLOPS,
        "attention": attention,
        "prefill_gemm": prefill_gemm,
        "sampler": sampler,
        "moe": moe,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"device {result['device']}: read {measured['read'] / 1e9:.0f} GB/s, copy {measured['copy'] / 1e9:.0f} GB/s")
    print_gemv(gemv)
    for r in gdn:
        print(f"gdn_decode batch {r['batch']}: {r['median_us']:.1f} us, {r['fraction_of_bandwidth']:.1%} of read BW")
    print(f"gdn prefill, 27B linear-attention layer (16/48 heads, 128/128), batch 1; f32 rate "
          f"{F32_FLOPS / 1e12:.1f}, tf32 rate {TF32_FLOPS / 1e12:.1f} TFLOP/s; scan = total - prepare")
    print(f"{'tokens':>6} {'us':>9} {'prepare':>8} {'scan':>8} {'f32 scan':>9} {'tok/s':>10} {'TFLOP/s':>8} "
          f"{'FLOP limit us':>13} {'I/O limit us':>12} {'workspace us':>12} {'x 48 layers ms':>14}")
    for r in prefill:
        print(f"{r['tokens']:>6} {r['median_us']:9.1f} {r['prepare_us']:8.1f} {r['scan_us']:8.1f} "
              f"{r['f32_scan_total_us']:9.1f} {r['tokens_per_s']:10.0f} {r['tflop_per_s']:8.2f} "
              f"{r['flop_limit_us']:13.1f} {r['io_limit_us']:12.1f} {r['workspace_limit_us']:12.1f} "
              f"{48 * r['median_us'] / 1e3:14.2f}")
        if "sequential_twin_us" in r:
            print(f"{'':>6} per-token twin: {r['sequential_twin_us']:.1f} us")
    print_row_ops(row_ops)
    print_attention(attention)
    if prefill_gemm:
        from cuda_gemm import print_table

        print_table(prefill_gemm)
    if moe:
        print_moe(moe)
    for r in sampler:
        print(f"sampler {r['case']:12} rows {r['rows']}: {r['median_us']:.1f} us (vocab {r['vocab']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
