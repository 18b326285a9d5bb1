"""Vision tower encode time and the time to first token of a one-image prompt, on synthetic artifacts (random
weights, bench/synthetic.py) with the released vision tower (or the tiny test one, for CPU figures).

Workloads are patch grids as the preprocessor makes them with the released geometry (16-px patches, 2 frames per
temporal patch): one 1024 x 1024 image (64 x 64 patches), four of them in one call, and a 10 s 720p video at the
released checkpoints' video settings (2 fps: 20 frames, 10 temporal groups, resized by the video rule). Encode time is `Model.encode_vision`
(patches in from the host, rows back to the host), median of --repeats after a warm-up. TTFT (--ttft) is the encode
plus the prefill of the prompt around the image (16 text tokens, the image's placeholders, 16 text tokens) in one
pass, through the last token's logits on the host; the engine's scheduler adds no device work to that.
Each figure is also given as achieved TFLOP/s: the tower's matmul and attention FLOPs over the encode time.
--op-times adds where one encode's device time goes: after the timings, one more encode of the first
workload on the model reopened with op timing (CUDA events around each backend op, as bench/cuda_engine.py
--op-times), so the timed figures are not taken with the events in.

    python bench/vision_tower.py --model qwen3.5-27b --layers 4 --out /tmp/vision_27b.json        # encode only
    python bench/vision_tower.py --model qwen3.5-27b --ttft --out /tmp/vision_27b_ttft.json
    python bench/vision_tower.py --model tiny --tower tiny --backend cpu --out bench/results/vision_cpu_tiny.json
    python bench/vision_tower.py --model qwen3.5-27b --layers 4 --workloads image-1024x1024 --op-times \
        --out /tmp/vision_27b_ops.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from cuda_engine import op_time_split
from cuda_kernels import source_commit
from ninfer import _testing
from ninfer.frontend.vision import VisionPreprocessor, smart_resize_video
from ninfer.frontend.vision_prompt import VisionSpan, mrope_positions
from synthetic import MODELS, VISION_TOKEN_IDS, with_layers, with_vision, write_synthetic

PATCH, MERGE, TEMPORAL = 16, 2, 2  # the released geometry the workloads are laid out in


# The released checkpoints' preprocessor settings (Qwen3.8-27B's preprocessor_config.json and
# video_preprocessor_config.json; tests/vision_media.py has the same).
RELEASED_IMAGE = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3,
                  "image_std": [0.5] * 3, "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
RELEASED_VIDEO = RELEASED_IMAGE | {"size": {"shortest_edge": 4096, "longest_edge": 25165824}}


def video_grid(seconds: float, height: int, width: int) -> tuple[int, int, int]:
    """The grid of a `seconds` long clip under the released checkpoints' video settings."""
    settings = VisionPreprocessor.from_configs(RELEASED_IMAGE, RELEASED_VIDEO).video_settings
    frames = min(max(int(seconds * settings.fps), settings.min_frames), settings.max_frames)
    frames += frames % TEMPORAL
    h, w = smart_resize_video(frames, height, width, factor=PATCH * MERGE, temporal_factor=TEMPORAL,
                              min_pixels=settings.min_pixels, max_pixels=settings.max_pixels)
    return frames // TEMPORAL, h // PATCH, w // PATCH


WORKLOADS = {
    "image-1024x1024": [(1, 64, 64)],
    "four-images-1024x1024": [(1, 64, 64)] * 4,
    "video-10s-720p": [video_grid(10.0, 720, 1280)],
}


def tower_flops(vision: dict, grids: list[tuple[int, int, int]]) -> float:
    """Multiply-adds x 2 of the patch embedding, every block's linears and attention, and the merger."""
    d, inner, out = vision["hidden_size"], vision["intermediate_size"], vision["out_hidden_size"]
    values = vision["in_channels"] * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    rows = sum(t * h * w for t, h, w in grids)
    segment_squares = sum(t * (h * w) ** 2 for t, h, w in grids)
    block = 2 * rows * (4 * d * d + 2 * d * inner) + 4 * segment_squares * d
    merger = 2 * (rows // 4) * (16 * d * d + 4 * d * out)
    return 2 * rows * values * d + vision["depth"] * block + merger


def timed(fn, repeats: int) -> list[float]:
    fn()  # warm-up: weight uploads, scratch growth
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return runs


def one_image_prompt(grid: tuple[int, int, int], text: int, rng: np.random.Generator):
    """(tokens, spans, positions [n, 3]) of `text` tokens, the image's placeholders, `text` tokens."""
    _, h, w = grid
    tokens = list(rng.integers(0, 240000, text)) + [VISION_TOKEN_IDS["vision_start_token_id"]]
    spans = [VisionSpan(0, 0, len(tokens), h // MERGE, w // MERGE)]
    tokens += [VISION_TOKEN_IDS["image_token_id"]] * (h * w // MERGE**2) + [VISION_TOKEN_IDS["vision_end_token_id"]]
    tokens += list(rng.integers(0, 240000, text))
    positions, _ = mrope_positions(len(tokens), spans)
    return np.asarray(tokens, np.int32), spans, np.ascontiguousarray(positions.T)


def encode_op_times(path: Path, name: str, values: int, rng: np.random.Generator) -> dict:
    """Device time per backend op of one encode of workload `name` (after a warm-up one) on the artifact at
    `path` opened with op timing; printed as a table."""
    model = _testing.Model.open(str(path), max_context=4096, kv_dtype="bf16", backend="cuda", vision=True,
                               op_times=True)
    grids = WORKLOADS[name]
    patches = rng.uniform(-1, 1, (sum(t * h * w for t, h, w in grids), values)).astype(np.float32)
    model.encode_vision(patches, grids)  # warm-up: weight uploads, scratch growth
    before = model.op_times()
    start = time.perf_counter()
    model.encode_vision(patches, grids)
    wall = time.perf_counter() - start
    split = op_time_split(before, model.op_times())
    total = sum(t["device_us"] for t in split.values())
    print(f"device time per op, one encode of {name}: {total / 1e3:.2f} ms in ops of {wall * 1e3:.1f} ms "
          "wall (with the events)", flush=True)
    for op, t in split.items():
        ms, share = t["device_us"] / 1e3, t["device_us"] / total
        print(f"  {op:22s} {t['calls']:6d} calls {ms:9.2f} ms {share:6.1%}", flush=True)
    return {"workload": name, "wall_ms": wall * 1e3, "device_ms": total / 1e3, "ops": split}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--tower", choices=["released", "tiny"], default="released")
    parser.add_argument("--recipe", default="groupwise-int", help="the text model's recipe (the tower is bf16)")
    parser.add_argument("--layers", type=int, default=None,
                        help="text layers to keep (a multiple of 4; encode times do not depend on them)")
    parser.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--ttft", action="store_true", help="also the TTFT of a one-image (1024 x 1024) prompt")
    parser.add_argument("--op-times", action="store_true",
                        help="also the device time per backend op of one encode of the first workload (cuda)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.op_times and args.backend != "cuda":
        parser.error("--op-times times the CUDA backend's ops")
    config = with_vision(MODELS[args.model], args.tower)
    if args.layers:
        config = with_layers(config, args.layers)
    vision = config["vision"]
    values = vision["in_channels"] * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    rng = np.random.default_rng(0)
    result = {"model": args.model, "tower": args.tower, "vision": vision, "text_layers": config["num_layers"],
              "recipe": args.recipe, "backend": args.backend, "commit": source_commit(),
              "device": _testing.cuda.device_name() if args.backend == "cuda" else "cpu",
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "encode": []}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        path = Path(tmp) / "model.ninfer"
        started = time.perf_counter()
        write_synthetic(args.model, args.recipe, path, progress=False, config=config)
        result["write_s"] = time.perf_counter() - started
        model = _testing.Model.open(str(path), max_context=4096, kv_dtype="bf16", threads=args.threads,
                                   backend=args.backend, vision=True)
        for name in args.workloads:
            grids = WORKLOADS[name]
            patches = rng.uniform(-1, 1, (sum(t * h * w for t, h, w in grids), values)).astype(np.float32)
            runs = timed(lambda patches=patches, grids=grids: model.encode_vision(patches, grids), args.repeats)
            median = statistics.median(runs)
            entry = {"workload": name, "grids": grids, "patches": len(patches),
                     "tokens": len(patches) // MERGE**2, "encode_ms": median * 1e3,
                     "encode_ms_runs": [r * 1e3 for r in runs],
                     "tflop_per_s": tower_flops(vision, grids) / median / 1e12}
            result["encode"].append(entry)
            print(f"{name}: {entry['patches']} patches, encode {entry['encode_ms']:.1f} ms "
                  f"({entry['tflop_per_s']:.1f} TFLOP/s)", flush=True)
        if args.ttft:
            grid = WORKLOADS["image-1024x1024"][0]
            tokens, spans, positions = one_image_prompt(grid, 16, rng)
            patches = rng.uniform(-1, 1, (grid[0] * grid[1] * grid[2], values)).astype(np.float32)

            def first_token() -> None:
                rows = model.encode_vision(patches, [grid])
                seq = model.new_sequence()
                model.prefill(seq, tokens, media=[(spans[0].start, rows)], mrope_positions=positions)
                model.release(seq)

            runs = timed(first_token, args.repeats)
            result["ttft"] = {"prompt_tokens": len(tokens), "image_tokens": spans[0].length,
                              "ttft_ms": statistics.median(runs) * 1e3, "ttft_ms_runs": [r * 1e3 for r in runs]}
            print(f"TTFT, one 1024x1024 image in a {len(tokens)}-token prompt: {result['ttft']['ttft_ms']:.1f} ms",
                  flush=True)
        if args.op_times and args.workloads:
            del model  # one model on the device at a time
            result["op_times"] = encode_op_times(path, args.workloads[0], values, rng)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
