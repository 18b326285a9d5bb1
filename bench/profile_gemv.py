"""One decode-GEMV shape under a profiler: writes a random-code artifact with one weight and runs both GEMV
implementations a few times (`ncu -k regex:gemv ... python bench/profile_gemv.py --encoding int4`)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from artifact_files import random_codes, write_artifact  # noqa: E402
from ninfer import _engine, _testing  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--encoding", default="int4")
    parser.add_argument("--group", type=int, default=128)
    parser.add_argument("--shape", type=int, nargs=2, default=[12288, 5120])
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--impls", nargs="+", default=["mma", "mma_v3", "simt"])
    args = parser.parse_args()
    group = args.group if args.encoding in ("int4", "int8") else None
    with tempfile.TemporaryDirectory() as tmp:
        codes = random_codes(np.random.default_rng(0), args.encoding, tuple(args.shape), group, nan_codes=False)
        art = _engine.Artifact.open(write_artifact(Path(tmp) / "w.ninfer", {"w": codes}), verify_checksums=False)
        for impl in args.impls:
            micros, _ = _testing.cuda.bench_linear(art, "w", args.rows, copies=4, iterations=10, impl=impl)
            print(f"{impl} {args.encoding} {args.shape} rows={args.rows}: {micros:.1f} us")
        art.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
