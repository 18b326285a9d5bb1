"""Store a trained MTP head file (f16, as train.py writes it) in the int8 layout that ships: every 2-D tensor as I8
codes with per-row F16 scales (symmetric, scale = max|row| / 127 rounded up to f16), the 1-D norms kept F16
(ninfer.artifact.mtp_head documents and reads both layouts). Half the size; the converter dequantises it on import
and then encodes it by its recipe as before (the default's `groupwise-int`: int4 g64).

Run: .venv/bin/python bench/mtp_head/quantize_int8.py SRC.safetensors OUT.safetensors [--expect-sha256 HEX]

The shipped python/ninfer/default_mtp/SmolLM2-135M-Instruct.mtp-int8.safetensors is this script's output for the
f16 head train.py wrote (bench/mtp_head/README.md, sha256 in ORIGINAL_SHA256); the output is byte-for-byte
reproducible (codes and scales are deterministic and the file has a single metadata entry: safetensors writes
several in no fixed order). Prints each tensor's largest error against its bound of scale / 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
from ninfer.artifact.mtp_head import SCALE_SUFFIX, int8_head_tensors
from safetensors import safe_open
from safetensors.numpy import save_file

# The f16 head of the seed-0 training run (bench/results/mtp_head_train_smollm2.json), committed until the int8
# layout replaced it (git history: python/ninfer/default_mtp/SmolLM2-135M-Instruct.mtp.safetensors, 8,412,088 bytes).
ORIGINAL_SHA256 = "10027c53912db491c199a6c9757492e4805ec0cbc3e761e51209572c951080e4"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="the f16 head (train.py's mtp_head.safetensors)")
    ap.add_argument("out", type=Path)
    ap.add_argument("--expect-sha256", default=ORIGINAL_SHA256,
                    help="refuse a source with another sha256 ('' accepts any; default: the shipped head's original)")
    args = ap.parse_args()
    digest = sha256(args.src)
    if args.expect_sha256 and digest != args.expect_sha256:
        raise SystemExit(f"{args.src} has sha256 {digest}, expected {args.expect_sha256} (--expect-sha256 '' for "
                         "another head)")
    with safe_open(str(args.src), framework="numpy") as handle:
        source = {name: handle.get_tensor(name) for name in handle.keys()}
        metadata = handle.metadata() or {}
    if any(value.dtype != np.float16 for value in source.values()):
        raise SystemExit(f"{args.src}: expected an all-F16 head, got "
                         f"{sorted({str(v.dtype) for v in source.values()})}")
    out = int8_head_tensors(source)
    for name, value in sorted(source.items()):
        if value.ndim != 2:
            continue
        scale = out[name + SCALE_SUFFIX].astype(np.float64)
        error = np.abs(out[name].astype(np.float64) * scale[:, None] - value.astype(np.float64)).max(axis=1)
        ratio = np.divide(error, scale / 2, out=np.zeros_like(error), where=scale > 0)  # a zero row is exact
        print(f"{name} {list(value.shape)}: max error / (scale / 2) = {float(ratio.max()):.3f}, "
              f"scales {float(scale.min()):.3g}..{float(scale.max()):.3g}")
    note = {**metadata, "encoding": "2-D tensors int8, symmetric per row: value = code * NAME.scale (F16); "
                                    "1-D tensors F16", "source_sha256": digest}
    save_file(out, str(args.out), metadata={"ninfer_mtp_head": json.dumps(note, sort_keys=True)})
    print(f"wrote {args.out}: {args.out.stat().st_size} bytes (from {args.src.stat().st_size}), "
          f"sha256 {sha256(args.out)}")


if __name__ == "__main__":
    main()
