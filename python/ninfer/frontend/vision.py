"""Qwen3.5 image and video preprocessing: pixels -> the vision tower's input patches (architecture reference §7.4-7.5).

An image or a video becomes `pixel_values` [grid_t * grid_h * grid_w, C * Tp * P * P] (float32) and its grid
(grid_t, grid_h, grid_w) in patches: resized with Qwen's smart resize (sides multiples of patch * merge, area
within the model's pixel budget, aspect kept), rescaled and normalised with the model's mean and std, cut into
P x P patches of Tp consecutive frames (a still image is repeated Tp times), and ordered merge block by merge
block, so every merge x merge block of patches is consecutive: exactly HF's Qwen2-VL image processor (its Pillow
backend) and Qwen3-VL video processor. Each merge block becomes one placeholder token in the prompt.

Resizing is Pillow's bicubic on 8-bit RGB for images and video frames alike. HF's video processor (and its
torchvision image backend) resizes with torchvision's bicubic instead, which can differ by one 8-bit level on some
pixels; sizes, sampling, order and normalisation are the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from PIL import Image

from ninfer.errors import MediaError
from ninfer.frontend.media_decode import decode_image, decode_video
from ninfer.frontend.media_limits import MediaLimits

# Pillow's filter numbers (the preprocessor configs' `resample`): 3 bicubic is what Qwen ships.
_RESAMPLE = {0: Image.Resampling.NEAREST, 1: Image.Resampling.LANCZOS, 2: Image.Resampling.BILINEAR,
             3: Image.Resampling.BICUBIC, 4: Image.Resampling.BOX, 5: Image.Resampling.HAMMING}
_MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class PatchGeometry:
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this: one merge block of patches."""
        return self.patch_size * self.merge_size


@dataclass(frozen=True)
class ImageSettings:
    geometry: PatchGeometry
    min_pixels: int
    max_pixels: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale_factor: float
    resample: int


@dataclass(frozen=True)
class VideoSettings(ImageSettings):
    fps: float
    min_frames: int
    max_frames: int
    # qwen-vl-utils' per-frame cap (HF's `cap_pixels_per_frame`, off by default in transformers 5.23).
    cap_pixels_per_frame: bool
    max_frame_tokens: int


@dataclass(frozen=True)
class VisionInput:
    """One image or video, ready for the vision tower."""

    kind: Literal["image", "video"]
    pixel_values: np.ndarray  # [grid_t * grid_h * grid_w, C * Tp * P * P] float32
    grid_thw: tuple[int, int, int]  # in patches
    merge_size: int
    # Video only: the time (seconds) of each temporal patch group, as the prompt states it.
    timestamps: tuple[float, ...] = ()

    @property
    def tokens_per_group(self) -> int:
        """Placeholder tokens of one temporal group (an image has one group)."""
        _, h, w = self.grid_thw
        return h * w // (self.merge_size * self.merge_size)

    @property
    def num_tokens(self) -> int:
        return self.grid_thw[0] * self.tokens_per_group


def smart_resize(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int,
                 num_frames: int = 1, budget_frames: int = 1) -> tuple[int, int]:
    """Qwen's target size: sides rounded to multiples of `factor`, then scaled (aspect kept) until
    budget_frames * height * width lies within [min_pixels, max_pixels]. An image has one frame; a video's
    budget counts its frames rounded to whole temporal patches (the scale itself uses the exact count, as HF
    does). Raises ValueError for an aspect ratio over 200."""
    if max(height, width) / min(height, width) > _MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio {max(height, width) / min(height, width):.0f} is over {_MAX_ASPECT_RATIO}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if budget_frames * h_bar * w_bar > max_pixels:
        beta = math.sqrt(num_frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif budget_frames * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def smart_resize_video(num_frames: int, height: int, width: int, *, factor: int, temporal_factor: int,
                       min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The video variant (Qwen3-VL): a side under one block is first scaled up to it, and the pixel budget is
    for the whole clip. A clip of fewer frames than a temporal patch counts as one patch."""
    num_frames = max(num_frames, temporal_factor)
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    budget_frames = round(num_frames / temporal_factor) * temporal_factor
    return smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels,
                        num_frames=num_frames, budget_frames=budget_frames)


def sample_frame_indices(total_frames: int, video_fps: float, settings: VideoSettings, limit: int) -> np.ndarray:
    """Frames to keep: `settings.fps` per second of video, at least min_frames, at most max_frames, `limit`
    and the video's own frame count, spread evenly from the first frame to the last."""
    count = int(total_frames / video_fps * settings.fps)
    count = min(max(count, settings.min_frames), settings.max_frames, limit, total_frames)
    return np.linspace(0, total_frames - 1, count).round().astype(np.int64)


def group_timestamps(indices: np.ndarray, video_fps: float, temporal_patch_size: int) -> tuple[float, ...]:
    """The time of each temporal group: the mean of its first and last frame's times (the last frame repeated
    to fill the final group, as the pixels are)."""
    padded = list(indices) + [indices[-1]] * (-len(indices) % temporal_patch_size)
    times = [int(i) / video_fps for i in padded]
    return tuple((times[g] + times[g + temporal_patch_size - 1]) / 2
                 for g in range(0, len(times), temporal_patch_size))


def normalise(frames: np.ndarray, settings: ImageSettings) -> np.ndarray:
    """[n, H, W, C] uint8 -> [n, C, H, W] float32: rescale, then (x - mean) / std per channel."""
    scaled = (frames.astype(np.float64) * settings.rescale_factor).astype(np.float32)
    mean = np.asarray(settings.mean, dtype=np.float32)
    std = np.asarray(settings.std, dtype=np.float32)
    return ((scaled - mean) / std).transpose(0, 3, 1, 2)


def patchify(frames: np.ndarray, geometry: PatchGeometry) -> tuple[np.ndarray, tuple[int, int, int]]:
    """[n, C, H, W] -> ([grid_t * grid_h * grid_w, C * Tp * P * P], grid). n is padded to a multiple of Tp with
    the last frame; patches are ordered (t, block row, block col, row in block, col in block), each one
    flattened as (C, Tp, P, P)."""
    tp, p, m = geometry.temporal_patch_size, geometry.patch_size, geometry.merge_size
    if pad := -len(frames) % tp:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
    n, c, height, width = frames.shape
    gt, gh, gw = n // tp, height // p, width // p
    blocks = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    blocks = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # t, bh, bw, mh, mw, C, Tp, ph, pw
    return np.ascontiguousarray(blocks.reshape(gt * gh * gw, c * tp * p * p)), (gt, gh, gw)


def _resize_frame(frame: Image.Image, size: tuple[int, int], settings: ImageSettings) -> np.ndarray:
    height, width = size
    if frame.size != (width, height):
        frame = frame.resize((width, height), resample=_RESAMPLE[settings.resample])
    return np.asarray(frame, dtype=np.uint8)


def _refuse_bad_aspect(part: str, exc: ValueError) -> MediaError:
    return MediaError(part, f"cannot be resized for the model: {exc}")


class VisionPreprocessor:
    """Encoded image / video bytes -> VisionInput, with the model's settings and the server's limits."""

    def __init__(self, image: ImageSettings, video: VideoSettings, limits: MediaLimits | None = None) -> None:
        self.image_settings = image
        self.video_settings = video
        self.limits = limits or MediaLimits()

    @classmethod
    def from_configs(cls, image: Mapping[str, Any] | None, video: Mapping[str, Any] | None,
                     limits: MediaLimits | None = None) -> VisionPreprocessor:
        """From the checkpoint's preprocessor_config.json and video_preprocessor_config.json (an artifact's
        frontend preprocessing "image" / "video"); a missing video config takes the image config's geometry,
        mean and std with Qwen3-VL's video defaults."""
        image_settings = image_settings_from(image or {})
        return cls(image_settings, video_settings_from(video, image_settings), limits)

    def image(self, data: bytes, *, part: str) -> VisionInput:
        settings = self.image_settings
        picture = decode_image(data, part=part, limits=self.limits)
        try:
            size = smart_resize(picture.height, picture.width, factor=settings.geometry.factor,
                                min_pixels=settings.min_pixels, max_pixels=settings.max_pixels)
        except ValueError as exc:
            raise _refuse_bad_aspect(part, exc) from None
        frames = _resize_frame(picture, size, settings)[None]
        # A still image fills every frame of its temporal patch.
        pixels, grid = patchify(normalise(frames, settings), settings.geometry)
        return VisionInput("image", pixels, grid, settings.geometry.merge_size)

    def video(self, data: bytes, *, part: str) -> VisionInput:
        settings = self.video_settings
        limit = self.limits.max_video_frames
        decoded = decode_video(data, part=part, limits=self.limits,
                               sample=lambda total, fps: sample_frame_indices(total, fps, settings, limit))
        count, height, width = decoded.frames.shape[:3]
        temporal = settings.geometry.temporal_patch_size
        budget = _video_budget(settings, count)
        try:
            size = smart_resize_video(count, height, width, factor=settings.geometry.factor,
                                      temporal_factor=temporal, min_pixels=budget.min_pixels,
                                      max_pixels=budget.max_pixels)
        except ValueError as exc:
            raise _refuse_bad_aspect(part, exc) from None
        frames = np.stack([_resize_frame(Image.fromarray(f), size, settings) for f in decoded.frames])
        pixels, grid = patchify(normalise(frames, settings), settings.geometry)
        timestamps = group_timestamps(decoded.indices, decoded.fps, temporal)
        return VisionInput("video", pixels, grid, settings.geometry.merge_size, timestamps)


def _video_budget(settings: VideoSettings, num_frames: int) -> VideoSettings:
    """The settings with the clip's pixel budget after qwen-vl-utils' per-frame cap, when that is on."""
    if not settings.cap_pixels_per_frame:
        return settings
    factor = settings.geometry.factor
    frame_cap = settings.max_frame_tokens * factor * factor
    per_frame = max(min(frame_cap, settings.max_pixels // num_frames), int(settings.min_pixels * 1.05))
    return replace(settings, max_pixels=per_frame * num_frames)


def _pixel_bounds(config: Mapping[str, Any], default_min: int, default_max: int) -> tuple[int, int]:
    size = config.get("size") or {}
    low = config.get("min_pixels", size.get("shortest_edge", default_min))
    high = config.get("max_pixels", size.get("longest_edge", default_max))
    return int(low), int(high)


def _geometry(config: Mapping[str, Any], fallback: PatchGeometry) -> PatchGeometry:
    return PatchGeometry(
        patch_size=int(config.get("patch_size", fallback.patch_size)),
        temporal_patch_size=int(config.get("temporal_patch_size", fallback.temporal_patch_size)),
        merge_size=int(config.get("merge_size", fallback.merge_size)),
    )


def _triple(value: Any, default: tuple[float, float, float]) -> tuple[float, float, float]:
    if value is None:
        return default
    values = [float(v) for v in (value if isinstance(value, (list, tuple)) else [value] * 3)]
    return values[0], values[1], values[2]


_HALF = (0.5, 0.5, 0.5)  # Qwen's mean and std (HF's IMAGENET_STANDARD_*), the video processor's default


def image_settings_from(config: Mapping[str, Any]) -> ImageSettings:
    """Settings from a preprocessor_config.json; absent fields take HF Qwen2-VL image processor defaults, except
    geometry and pixel bounds, which take Qwen3.5's (16-px patches, 65536..16777216 pixels)."""
    low, high = _pixel_bounds(config, 65536, 16777216)
    return ImageSettings(
        geometry=_geometry(config, PatchGeometry()),
        min_pixels=low,
        max_pixels=high,
        mean=_triple(config.get("image_mean"), _HALF),
        std=_triple(config.get("image_std"), _HALF),
        rescale_factor=float(config.get("rescale_factor", 1 / 255)),
        resample=_resample(config),
    )


def video_settings_from(config: Mapping[str, Any] | None, image: ImageSettings) -> VideoSettings:
    """Settings from a video_preprocessor_config.json (HF Qwen3-VL video processor defaults for absent fields);
    without one, the image's geometry, mean and std."""
    config = config or {}
    low, high = _pixel_bounds(config, 128 * 32 * 32, 32 * 32 * 768)
    return VideoSettings(
        geometry=_geometry(config, image.geometry),
        min_pixels=low,
        max_pixels=high,
        mean=_triple(config.get("image_mean"), image.mean),
        std=_triple(config.get("image_std"), image.std),
        rescale_factor=float(config.get("rescale_factor", image.rescale_factor)),
        resample=_resample(config),
        fps=float(config.get("fps", 2)),
        min_frames=int(config.get("min_frames", 4)),
        max_frames=int(config.get("max_frames", 768)),
        cap_pixels_per_frame=bool(config.get("cap_pixels_per_frame") or False),
        max_frame_tokens=int(config.get("max_video_tokens", 768)),
    )


def _resample(config: Mapping[str, Any]) -> int:
    resample = int(config.get("resample", 3))
    if resample not in _RESAMPLE:
        raise ValueError(f"preprocessor config: unknown resample filter {resample}")
    return resample
