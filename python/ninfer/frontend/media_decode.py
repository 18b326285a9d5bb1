"""Encoded media -> pixels: images with Pillow, videos with PyAV, each under MediaLimits.

Images: PNG, JPEG, WebP and GIF (first frame only, so an animation's frame count costs nothing); the EXIF
orientation is applied; transparency is flattened onto white (what Qwen's own qwen-vl-utils does; a plain RGB
convert would expose whatever colour the transparent pixels happen to hold). Videos: any container and codec
the bundled FFmpeg reads; only the frames at the sampled indices are converted to RGB.

Every failure is a MediaError naming the part: nothing here lets a decoder's own exception escape.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ninfer.errors import MediaError
from ninfer.frontend.media_limits import MediaLimits

if TYPE_CHECKING:
    import av

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
_WHITE = (255, 255, 255)


def _check_size(part: str, data: bytes, limits: MediaLimits) -> None:
    if not data:
        raise MediaError(part, "the file is empty (0 bytes)")
    if len(data) > limits.max_part_bytes:
        raise MediaError(part, f"the file is {len(data)} bytes, over the limit of {limits.max_part_bytes}")


def decode_image(data: bytes, *, part: str, limits: MediaLimits) -> Image.Image:
    """The image as an RGB Pillow image, upright and without transparency."""
    _check_size(part, data, limits)
    try:
        with warnings.catch_warnings():
            # Pillow's own bomb bound (a warning, then an error at twice the size) counts as a refusal too.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
            width, height = image.size
            if width == 0 or height == 0:
                raise MediaError(part, f"the image is {width}x{height} pixels")
            if width * height > limits.max_image_pixels:
                raise MediaError(part, f"the image is {width}x{height} ({width * height} pixels), over the "
                                       f"limit of {limits.max_image_pixels} pixels")
            image.load()  # the first frame of an animation
            image = ImageOps.exif_transpose(image)
    except UnidentifiedImageError:
        raise MediaError(part, f"not an image in a supported format ({', '.join(IMAGE_FORMATS)})") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise MediaError(part, f"the image declares too many pixels ({exc})") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise MediaError(part, f"the image data is corrupt or truncated ({exc})") from None
    return _flatten_to_rgb(image)


def _flatten_to_rgb(image: Image.Image) -> Image.Image:
    has_alpha = image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)
    if not has_alpha:
        return image if image.mode == "RGB" else image.convert("RGB")
    rgba = image.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (*_WHITE, 255)), rgba).convert("RGB")


@dataclass(frozen=True)
class DecodedVideo:
    frames: np.ndarray  # [n, H, W, 3] uint8, the sampled frames in order
    indices: np.ndarray  # [n] the sampled frames' indices in the stream
    fps: float  # the stream's average frame rate
    total_frames: int


# (total frames, fps) -> the indices to keep, ascending.
FrameSampler = Callable[[int, float], np.ndarray]


def decode_video(data: bytes, *, part: str, limits: MediaLimits, sample: FrameSampler) -> DecodedVideo:
    """The frames `sample` picks from the first video stream, as RGB arrays."""
    # PyAV (FFmpeg) is loaded with the first video, not with the engine: text and images never need it.
    import av
    import av.error

    _check_size(part, data, limits)
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise MediaError(part, "the file has no video stream")
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            if width <= 0 or height <= 0:
                raise MediaError(part, f"the video's frames are {width}x{height} pixels")
            if width * height > limits.max_video_frame_pixels:
                raise MediaError(part, f"the video's frames are {width}x{height} ({width * height} pixels), "
                                       f"over the limit of {limits.max_video_frame_pixels} pixels")
            rate = stream.average_rate or stream.guessed_rate
            if not rate or float(rate) <= 0:
                raise MediaError(part, "the video has no frame rate")
            total = stream.frames or _count_frames(container, stream, part, limits)
            if total > limits.max_video_source_frames:
                raise MediaError(part, f"the video has {total} frames, over the limit of "
                                       f"{limits.max_video_source_frames}")
            indices = sample(total, float(rate))
            frames = _decode_frames(container, stream, indices, (height, width), part, limits)
    except av.error.FFmpegError as exc:
        raise MediaError(part, f"the video data is corrupt, truncated or of an unsupported format ({exc})") from None
    return DecodedVideo(frames=frames, indices=indices, fps=float(rate), total_frames=total)


def _count_frames(container: av.container.InputContainer, stream: av.video.stream.VideoStream, part: str,
                  limits: MediaLimits) -> int:
    """Frames in a stream whose header does not say (demuxing only, no decoding)."""
    count = 0
    for packet in container.demux(stream):
        if packet.size:
            count += 1
            if count > limits.max_video_source_frames:
                raise MediaError(part, f"the video has more than {limits.max_video_source_frames} frames, the limit")
    if count == 0:
        raise MediaError(part, "the video has no frames")
    container.seek(0)
    return count


def _decode_frames(container: av.container.InputContainer, stream: av.video.stream.VideoStream,
                   indices: np.ndarray, shape: tuple[int, int], part: str, limits: MediaLimits) -> np.ndarray:
    wanted: dict[int, list[int]] = {}
    for n, index in enumerate(indices):
        wanted.setdefault(int(index), []).append(n)
    frames: list[np.ndarray | None] = [None] * len(indices)
    last = int(indices[-1])
    found = 0
    for position, frame in enumerate(container.decode(stream)):
        if position > limits.max_video_source_frames:
            raise MediaError(part, f"the video has more than {limits.max_video_source_frames} frames, the limit")
        if position in wanted:
            if (frame.height, frame.width) != shape:
                raise MediaError(part, f"frame {position} is {frame.width}x{frame.height}, not "
                                       f"{shape[1]}x{shape[0]} like the stream (size changes are not supported)")
            pixels = frame.to_ndarray(format="rgb24")
            for n in wanted[position]:
                frames[n] = pixels
                found += 1
        if position >= last:
            break
    if found < len(indices):
        raise MediaError(part, f"the video is truncated: frame {last} of the declared frames does not decode")
    return np.stack(frames)  # type: ignore[arg-type]
