"""Limits on the media of one request: what a single image or video may cost to decode, and what one request may
carry in all. Every bound is a field with a default, so a server can set its own (docs/vision.md lists them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ninfer.errors import MediaError


def _limit(default: int, what: str) -> Any:
    """A limit's field: its default and what it bounds (the text of its command-line option and docs/vision.md)."""
    return field(default=default, metadata={"help": what})


@dataclass(frozen=True)
class MediaLimits:
    # One part, before decoding: the encoded bytes (after base64).
    max_part_bytes: int = _limit(64 * 2**20, "encoded bytes of one image or video")
    # Decoded size of one image (width * height, before the model's resize). Also keeps a small file that
    # declares a huge canvas (a decompression bomb) from being decoded at all: the header is checked first.
    max_image_pixels: int = _limit(8192 * 8192, "decoded width x height of one image, checked from its header")
    # Decoded size of one video frame, and how many frames a video may hold: decoding reads every frame up to
    # the last sampled one, so these two bound the decode time of a video.
    max_video_frame_pixels: int = _limit(3840 * 2160, "width x height of a video's frames")
    max_video_source_frames: int = _limit(9000, "frames one video may hold")
    # Frames sampled from one video (the model's own max_frames applies too; the smaller wins).
    max_video_frames: int = _limit(768, "frames sampled from one video (with the model's max_frames: the smaller)")
    # What one request may carry.
    max_images_per_request: int = _limit(32, "images in one request")
    max_videos_per_request: int = _limit(4, "videos in one request")
    max_vision_tokens_per_request: int = _limit(32768, "vision placeholder tokens of all of one request's media")

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"media limit {name} must be a positive integer, got {value!r}")


def check_request_media(kinds: Sequence[str], token_counts: Sequence[int], parts: Sequence[str],
                        limits: MediaLimits) -> None:
    """Refuse a request whose media, taken in order, cross a per-request limit; the error names the first part
    that crosses it. kinds[i] is "image" or "video", token_counts[i] its placeholder tokens, parts[i] its name."""
    images = videos = tokens = 0
    for kind, count, part in zip(kinds, token_counts, parts, strict=True):
        if kind == "image":
            images += 1
            if images > limits.max_images_per_request:
                raise MediaError(part, f"more than {limits.max_images_per_request} images in one request")
        else:
            videos += 1
            if videos > limits.max_videos_per_request:
                raise MediaError(part, f"more than {limits.max_videos_per_request} videos in one request")
        tokens += count
        if tokens > limits.max_vision_tokens_per_request:
            raise MediaError(part, f"the request's media need {tokens} vision tokens up to and including this "
                                   f"part, over the limit of {limits.max_vision_tokens_per_request}")
