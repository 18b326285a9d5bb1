"""Bad media and media over the limits: each is a MediaError (an EngineError, so a 400) that names the part and
says why; no decoder exception escapes, nothing hangs."""

from __future__ import annotations

import base64
import io
import struct
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))

from vision_media import TINY_IMAGE_CONFIG, TINY_VIDEO_CONFIG, encode_image, random_pixels, random_video  # noqa: E402

from ninfer.errors import EngineError, MediaError  # noqa: E402
from ninfer.frontend.data_url import parse_data_url  # noqa: E402
from ninfer.frontend.media_limits import MediaLimits, check_request_media  # noqa: E402
from ninfer.frontend.vision import VisionPreprocessor  # noqa: E402

PART = "messages[1].content[2]"
RNG = np.random.default_rng(11)
PNG = encode_image(random_pixels(RNG, 48, 64), "PNG")
JPEG = encode_image(random_pixels(RNG, 48, 64), "JPEG")
MP4 = random_video(RNG, 23, 40, 56, 10)


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height, with a few bytes of (incomplete) image data."""
    header = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + header + _png_chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _png_chunk(b"IEND", b"")


def _gif_bomb() -> bytes:
    """An animated GIF of 200 small frames on a 65535 x 65535 logical screen."""
    frames = [Image.fromarray(random_pixels(RNG, 8, 8)).convert("P") for _ in range(200)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=10)
    data = bytearray(buffer.getvalue())
    data[6:10] = struct.pack("<HH", 65535, 65535)
    return bytes(data)


def _corrupt_png() -> bytes:
    data = bytearray(PNG)
    middle = data.index(b"IDAT") + 40
    data[middle:middle + 16] = bytes(16)
    return bytes(data)


def _audio_only() -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="wav") as output:
        stream = output.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), dtype=np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in stream.encode(frame):
            output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)
    return buffer.getvalue()


def _bmp() -> bytes:
    return encode_image(random_pixels(RNG, 8, 8), "BMP")


# (name, kind, bytes, limits or None, words the reason must contain)
CASES: list[tuple[str, str, Callable[[], bytes], MediaLimits | None, str]] = [
    ("empty image", "image", lambda: b"", None, "empty (0 bytes)"),
    ("garbage image", "image", lambda: RNG.integers(0, 256, 500, dtype=np.uint8).tobytes(), None,
     "not an image in a supported format"),
    ("unsupported format (BMP)", "image", _bmp, None, "not an image in a supported format"),
    ("text as image", "image", lambda: b"hello, this is not a picture", None, "not an image"),
    ("truncated PNG", "image", lambda: PNG[: len(PNG) // 2], None, "corrupt or truncated"),
    ("truncated JPEG", "image", lambda: JPEG[: len(JPEG) // 2], None, "corrupt or truncated"),
    ("corrupt PNG", "image", _corrupt_png, None, "corrupt or truncated"),
    ("zero-width PNG", "image", lambda: _png_declaring(0, 16), None, "image"),
    ("decompression bomb (PNG header)", "image", lambda: _png_declaring(100_000, 100_000), None, "pixels"),
    ("bomb under Pillow's bound", "image", lambda: _png_declaring(9000, 9000), None, "over the limit"),
    ("animated bomb (GIF)", "image", _gif_bomb, None, "pixels"),
    ("over the byte limit", "image", lambda: PNG, MediaLimits(max_part_bytes=100), "over the limit of 100"),
    ("extreme aspect ratio", "image", lambda: encode_image(random_pixels(RNG, 1, 300), "PNG"), None,
     "aspect ratio"),
    ("empty video", "video", lambda: b"", None, "empty (0 bytes)"),
    ("garbage video", "video", lambda: RNG.integers(0, 256, 5000, dtype=np.uint8).tobytes(), None,
     "corrupt, truncated or of an unsupported format"),
    ("truncated video", "video", lambda: MP4[: len(MP4) // 2], None, "corrupt, truncated"),
    ("audio only", "video", _audio_only, None, "no video stream"),
    ("too many frames", "video", lambda: MP4, MediaLimits(max_video_source_frames=10), "over the limit of 10"),
    ("frames too large", "video", lambda: MP4, MediaLimits(max_video_frame_pixels=1000), "over the limit of 1000"),
]


@pytest.mark.parametrize("name,kind,make,limits,reason", CASES, ids=[c[0] for c in CASES])
def test_bad_media_is_a_media_error_naming_the_part(name: str, kind: str, make: Callable[[], bytes],
                                                    limits: MediaLimits | None, reason: str) -> None:
    preprocessor = VisionPreprocessor.from_configs(TINY_IMAGE_CONFIG, TINY_VIDEO_CONFIG, limits)
    started = time.monotonic()
    with pytest.raises(MediaError) as caught:
        getattr(preprocessor, kind)(make(), part=PART)
    assert time.monotonic() - started < 5, "refusing bad media must be quick"
    assert isinstance(caught.value, EngineError)  # served as a 400
    assert caught.value.part == PART
    assert reason in caught.value.reason, caught.value.reason
    assert str(caught.value).startswith(PART + ": ")


def test_good_media_pass_the_same_path() -> None:
    preprocessor = VisionPreprocessor.from_configs(TINY_IMAGE_CONFIG, TINY_VIDEO_CONFIG)
    assert preprocessor.image(PNG, part=PART).grid_thw == (1, 12, 16)
    assert preprocessor.video(MP4, part=PART).grid_thw == (2, 10, 14)


def test_sampled_frames_follow_the_limit() -> None:
    """max_video_frames bounds the sampled frames below the model's max_frames (12 in the tiny config)."""
    video = random_video(RNG, 60, 32, 32, 8)  # 7.5 s at 2 fps -> 15 frames, the model's bound takes 12
    grid = VisionPreprocessor.from_configs(TINY_IMAGE_CONFIG, TINY_VIDEO_CONFIG).video(video, part=PART).grid_thw
    limited = VisionPreprocessor.from_configs(TINY_IMAGE_CONFIG, TINY_VIDEO_CONFIG, MediaLimits(max_video_frames=5))
    assert grid[0] == 6 and limited.video(video, part=PART).grid_thw[0] == 3  # 5 frames, padded to 6


@pytest.mark.parametrize("url,reason", [
    ("data:image/png," + "a" * 8, "not base64-encoded"),
    ("data:image/png;base64,@@not-base64@@", "not valid base64"),
    ("data:image/png;base64,abc", "not valid base64"),  # not a multiple of 4
    ("data:image/png;base64,ïïïï", "not valid base64"),
    ("https://example.com/cat.png", "not a data URL"),
    ("data:image/png;base64", "not a data URL"),
    ("data:image/png;base64," + "A" * 400, "over the limit of 100 bytes"),
])
def test_bad_data_urls(url: str, reason: str) -> None:
    with pytest.raises(MediaError) as caught:
        parse_data_url(url, part=PART, max_bytes=100)
    assert caught.value.part == PART and reason in caught.value.reason


def test_data_url_payload_round_trips() -> None:
    encoded = base64.b64encode(PNG).decode()
    wrapped = "\n".join(encoded[i:i + 76] for i in range(0, len(encoded), 76))
    parsed = parse_data_url(f"data:Image/PNG;base64,{wrapped}", part=PART, max_bytes=len(PNG))
    assert parsed.data == PNG and parsed.media_type == "image/png"


def test_request_limits_name_the_first_part_over() -> None:
    limits = MediaLimits(max_images_per_request=2, max_videos_per_request=1, max_vision_tokens_per_request=100)
    parts = [f"part{i}" for i in range(4)]
    check_request_media(["image", "video", "image"], [30, 40, 30], parts[:3], limits)
    cases = [
        (["image", "image", "image"], [1, 1, 1], "part2", "more than 2 images"),
        (["video", "image", "video"], [1, 1, 1], "part2", "more than 1 videos"),
        (["image", "video", "image"], [30, 40, 31], "part2", "101 vision tokens"),
    ]
    for kinds, counts, part, reason in cases:
        with pytest.raises(MediaError) as caught:
            check_request_media(kinds, counts, parts[: len(kinds)], limits)
        assert caught.value.part == part and reason in caught.value.reason


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_images_per_request"):
        MediaLimits(max_images_per_request=0)
