"""Synthetic media for the vision tests: random images in each format, and short videos written with PyAV."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
from PIL import Image

# The tiny test checkpoints' preprocessor (tests/tiny_models.py) and Qwen3.8-27B's published ones.
TINY_IMAGE_CONFIG = {"patch_size": 4, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3,
                     "image_std": [0.5] * 3, "size": {"shortest_edge": 1024, "longest_edge": 65536}}
TINY_VIDEO_CONFIG = {"patch_size": 4, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3,
                     "image_std": [0.5] * 3, "size": {"shortest_edge": 256, "longest_edge": 98304},
                     "fps": 2, "min_frames": 4, "max_frames": 12}
REAL_IMAGE_CONFIG = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3,
                     "image_std": [0.5] * 3, "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
REAL_VIDEO_CONFIG = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3,
                     "image_std": [0.5] * 3, "size": {"shortest_edge": 4096, "longest_edge": 25165824}}


def random_pixels(rng: np.random.Generator, height: int, width: int, channels: int = 3) -> np.ndarray:
    """Smooth random content (so lossy codecs keep it recognisable) plus noise."""
    base = rng.integers(0, 256, (max(height // 8, 1) + 1, max(width // 8, 1) + 1, channels)).astype(np.uint8)
    big = np.asarray(Image.fromarray(base.squeeze()).resize((width, height), Image.Resampling.BILINEAR))
    noise = rng.integers(-20, 21, big.shape)
    return np.clip(big.astype(np.int64) + noise, 0, 255).astype(np.uint8).reshape(height, width, channels)


def encode_image(pixels: np.ndarray, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt, **options)
    return buffer.getvalue()


def encode_video(frames: np.ndarray, fps: int, *, container: str = "mp4", codec: str = "mpeg4") -> bytes:
    """[n, H, W, 3] uint8 frames -> a video file's bytes."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container) as output:
        stream = output.add_stream(codec, rate=Fraction(fps))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        if codec == "mpeg4":
            stream.options = {"qscale": "2"}
        for pixels in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)
    return buffer.getvalue()


def random_video(rng: np.random.Generator, frames: int, height: int, width: int, fps: int, **kwargs) -> bytes:
    return encode_video(np.stack([random_pixels(rng, height, width) for _ in range(frames)]), fps, **kwargs)
