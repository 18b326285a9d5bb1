"""Image and video preprocessing (ninfer.frontend.vision) against HF transformers' Qwen processors.

Images: HF's Qwen2-VL image processor (its Pillow backend, the one that runs without torchvision) on the same
decoded picture gives the same pixel values and grid. Videos: transformers' video processor needs torchvision,
whose PyPI wheels here are CUDA builds that do not load against the CPU torch, so the reference is assembled
from HF's own pieces: its PyAV reader with the Qwen3-VL processor's frame sampler, its video smart_resize, its
Pillow resize / rescale / normalize transforms and the video processor's patchify, and the Qwen3-VL processor's
timestamp rule.
"""

from __future__ import annotations

import importlib
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

sys.path.insert(0, str(Path(__file__).parent))

from vision_media import (  # noqa: E402
    REAL_IMAGE_CONFIG,
    REAL_VIDEO_CONFIG,
    TINY_IMAGE_CONFIG,
    TINY_VIDEO_CONFIG,
    encode_image,
    random_pixels,
    random_video,
)

from ninfer.artifact.convert import convert  # noqa: E402
from ninfer.artifact.reader import read_artifact  # noqa: E402
from ninfer.frontend.media_decode import decode_image  # noqa: E402
from ninfer.frontend.media_limits import MediaLimits  # noqa: E402
from ninfer.frontend.vision import VisionPreprocessor, smart_resize, smart_resize_video  # noqa: E402

transformers = pytest.importorskip("transformers")
from transformers.image_transforms import normalize, rescale, resize  # noqa: E402
from transformers.image_utils import ChannelDimension, PILImageResampling  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402
hf_video = importlib.import_module("transformers.models.qwen3_vl.video_processing_qwen3_vl")
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor  # noqa: E402
from transformers.video_utils import read_video_pyav  # noqa: E402

CONFIGS = {"tiny": (TINY_IMAGE_CONFIG, TINY_VIDEO_CONFIG), "real": (REAL_IMAGE_CONFIG, REAL_VIDEO_CONFIG)}


def _hf_image(config: dict, picture: Image.Image) -> tuple[np.ndarray, np.ndarray]:
    out = Qwen2VLImageProcessorPil(**config)(images=[picture], return_tensors="np")
    return out["pixel_values"], out["image_grid_thw"]


@pytest.mark.parametrize("name", ["tiny", "real"])
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_image_pixels_and_grid_equal_hf(name: str, fmt: str) -> None:
    image_config, _ = CONFIGS[name]
    preprocessor = VisionPreprocessor.from_configs(image_config, None)
    rng = np.random.default_rng(hash((name, fmt)) % 2**32)
    # Sizes that need no change, an upscale to the minimum, a downscale to the maximum (tiny), odd sides.
    for height, width in [(64, 96), (9, 13), (37, 301), (400, 250), (23, 23)]:
        data = encode_image(random_pixels(rng, height, width), fmt)
        mine = preprocessor.image(data, part="image")
        pixels, grid = _hf_image(image_config, Image.open(io.BytesIO(data)))
        assert mine.grid_thw == tuple(grid[0]), (height, width)
        assert mine.pixel_values.shape == pixels.shape
        np.testing.assert_allclose(mine.pixel_values, pixels, rtol=0, atol=1e-6)
        assert mine.num_tokens == grid[0].prod() // 4


def test_grid_sizes_equal_hf_over_many_shapes() -> None:
    rng = np.random.default_rng(1)
    for image_config, video_config in CONFIGS.values():
        hf_image = Qwen2VLImageProcessorPil(**image_config)
        factor = image_config["patch_size"] * image_config["merge_size"]
        size = image_config["size"]
        for _ in range(300):
            height, width = (int(x) for x in rng.integers(1, 5000, 2))
            if max(height, width) / min(height, width) > 200:
                continue
            mine = smart_resize(height, width, factor=factor, min_pixels=size["shortest_edge"],
                                max_pixels=size["longest_edge"])
            patches = hf_image.get_number_of_image_patches(height, width)
            assert mine[0] * mine[1] // image_config["patch_size"] ** 2 == patches, (height, width)
            frames = int(rng.integers(2, 40))
            vsize = video_config["size"]
            assert smart_resize_video(frames, height, width, factor=factor, temporal_factor=2,
                                      min_pixels=vsize["shortest_edge"], max_pixels=vsize["longest_edge"]) == \
                hf_video.smart_resize(frames, height, width, temporal_factor=2, factor=factor,
                                      min_pixels=vsize["shortest_edge"], max_pixels=vsize["longest_edge"])


def test_exif_orientation_is_applied() -> None:
    rng = np.random.default_rng(2)
    pixels = random_pixels(rng, 40, 72)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    data = encode_image(pixels, "JPEG", exif=exif.tobytes(), quality=95)
    mine = VisionPreprocessor.from_configs(TINY_IMAGE_CONFIG, None).image(data, part="image")
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    assert upright.size == (40, 72)  # the stored 72x40 picture stands up
    ref, grid = _hf_image(TINY_IMAGE_CONFIG, upright)
    assert mine.grid_thw == tuple(grid[0]) and mine.grid_thw[1] > mine.grid_thw[2]
    np.testing.assert_allclose(mine.pixel_values, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_alpha_is_flattened_onto_white(fmt: str) -> None:
    rng = np.random.default_rng(3)
    rgba = np.concatenate([random_pixels(rng, 30, 50), rng.integers(0, 256, (30, 50, 1), dtype=np.uint8)], -1)
    data = encode_image(rgba, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    flat = np.asarray(decode_image(data, part="image", limits=MediaLimits())).astype(np.float64)
    alpha = rgba[..., 3:].astype(np.float64) / 255
    expected = rgba[..., :3] * alpha + 255 * (1 - alpha)
    assert np.abs(flat - expected).max() <= 1.0


def test_gif_first_frame_only() -> None:
    rng = np.random.default_rng(4)
    frames = [Image.fromarray(random_pixels(rng, 24, 24)).convert("P") for _ in range(3)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=50)
    decoded = np.asarray(decode_image(buffer.getvalue(), part="image", limits=MediaLimits()))
    np.testing.assert_array_equal(decoded, np.asarray(frames[0].convert("RGB")))
    assert not np.array_equal(decoded, np.asarray(frames[1].convert("RGB")))


def _hf_video_reference(data: bytes, config: dict) -> tuple[np.ndarray, tuple[int, int, int], list[float]]:
    processor = hf_video.Qwen3VLVideoProcessor(**config, cap_pixels_per_frame=False)
    frames, metadata = read_video_pyav(io.BytesIO(data), processor.sample_frames)
    factor = processor.patch_size * processor.merge_size
    height, width = hf_video.smart_resize(len(frames), frames.shape[1], frames.shape[2], factor=factor,
                                          temporal_factor=processor.temporal_patch_size,
                                          min_pixels=processor.size["shortest_edge"],
                                          max_pixels=processor.size["longest_edge"])
    prepared = []
    for frame in frames:
        chw = frame.transpose(2, 0, 1)
        chw = resize(chw, (height, width), resample=PILImageResampling.BICUBIC,
                     data_format=ChannelDimension.FIRST, input_data_format=ChannelDimension.FIRST)
        chw = rescale(chw, 1 / 255, input_data_format=ChannelDimension.FIRST)
        prepared.append(normalize(chw, processor.image_mean, processor.image_std,
                                  input_data_format=ChannelDimension.FIRST))
    video = torch.from_numpy(np.stack(prepared))[None]
    patches, gt, gh, gw = processor.patchify(video, processor.patch_size, processor.merge_size,
                                             processor.temporal_patch_size)
    timestamps = Qwen3VLProcessor._calculate_timestamps(None, metadata.frames_indices, metadata.fps,
                                                        processor.temporal_patch_size)
    return patches[0].numpy(), (gt, gh, gw), timestamps


@pytest.mark.parametrize("name", ["tiny", "real"])
def test_video_pixels_grid_and_timestamps_equal_hf(name: str) -> None:
    image_config, video_config = CONFIGS[name]
    preprocessor = VisionPreprocessor.from_configs(image_config, video_config)
    rng = np.random.default_rng(5)
    # (frames, height, width, fps): sampled 2 fps, min_frames bound, odd frame count (last frame repeated),
    # max_frames bound (tiny config: 12), and a downscale to the clip budget.
    cases = [(23, 40, 56, 10), (5, 32, 32, 8), (14, 24, 40, 4), (60, 48, 64, 8), (9, 128, 96, 6)]
    for frames, height, width, fps in cases:
        data = random_video(rng, frames, height, width, fps)
        mine = preprocessor.video(data, part="video")
        pixels, grid, timestamps = _hf_video_reference(data, video_config)
        assert mine.grid_thw == grid, (frames, height, width, fps)
        np.testing.assert_allclose(mine.timestamps, timestamps, rtol=0, atol=1e-9)
        np.testing.assert_allclose(mine.pixel_values, pixels, rtol=0, atol=1e-6)


def test_video_without_a_frame_count_in_its_header() -> None:
    """WebM declares no frame count: the frames are counted by demuxing and sampled the same way."""
    rng = np.random.default_rng(6)
    preprocessor = VisionPreprocessor.from_configs(TINY_IMAGE_CONFIG, TINY_VIDEO_CONFIG)
    webm = preprocessor.video(random_video(rng, 23, 40, 56, 10, container="webm", codec="libvpx-vp9"), part="v")
    # 23 frames at 10 fps -> int(2.3 * 2) = 4 frames, indices 0, 7, 15, 22 -> groups at 0.35 s and 1.85 s.
    assert webm.grid_thw == (2, 10, 14)
    assert webm.timestamps == pytest.approx((0.35, 1.85))


def test_settings_from_a_converted_artifact_equal_hf(tiny_qwen3_5, tmp_path) -> None:
    """The artifact carries the checkpoint's preprocessor config; preprocessing from it equals HF's processor
    built from the checkpoint's own file."""
    with read_artifact(convert(tiny_qwen3_5, tmp_path / "q.ninfer", progress=False)) as artifact:
        preprocessing = artifact.frontend["preprocessing"]
    preprocessor = VisionPreprocessor.from_configs(preprocessing.get("image"), preprocessing.get("video"))
    checkpoint_config = json.loads((tiny_qwen3_5 / "preprocessor_config.json").read_text())
    checkpoint_config.pop("image_processor_type")
    data = encode_image(random_pixels(np.random.default_rng(8), 70, 45), "PNG")
    pixels, grid = _hf_image(checkpoint_config, Image.open(io.BytesIO(data)))
    mine = preprocessor.image(data, part="image")
    assert mine.grid_thw == tuple(grid[0])
    np.testing.assert_allclose(mine.pixel_values, pixels, rtol=0, atol=1e-6)
