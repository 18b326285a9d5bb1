"""Images and videos in chat messages: every protocol's media part -> the one part the chat template turns into a
vision placeholder, and the bytes behind it, named as the caller numbered the part (`messages[1].content[2]`).

Accepted parts (architecture reference §7.6 for what the template writes):
- OpenAI chat `{"type": "image_url", "image_url": {"url": URL}}` and `{"type": "video_url", "video_url": {"url":
  URL}}` (the vLLM / Qwen convention for video);
- Responses `{"type": "input_image", "image_url": URL}`;
- Anthropic `{"type": "image", "source": {"type": "base64", "media_type": ..., "data": ...}}`;
- the CLI's `{"type": "image", "image": PATH}` / `{"type": "video", "video": PATH}`.
URL is a base64 data URL; a local path (or file:// URL) only where the caller allows files (the CLI). Remote URLs
are refused: the server fetches nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ninfer.errors import MediaError
from ninfer.frontend.chat import MEDIA_MARKERS, flatten_content, is_media_part
from ninfer.frontend.data_url import is_data_url, parse_data_url
from ninfer.frontend.media_limits import MediaLimits, check_request_media
from ninfer.frontend.vision import VisionInput, VisionPreprocessor

# A protocol whose messages are not the request's own (Anthropic's, Responses' converted turns) tags each media part
# with the caller's name for it under this key (tag_media_parts); extract_media reads and drops it.
PART_NAME_KEY = "ninfer_part"


def tag_media_parts(content: Any, where: str) -> Any:
    """`content` with each media part tagged with its name `where[j]` (other parts and non-lists unchanged)."""
    if not isinstance(content, list):
        return content
    return [dict(part, **{PART_NAME_KEY: f"{where}[{j}]"}) if is_media_part(part) else part
            for j, part in enumerate(content)]


def flatten_unless_media(content: Any, *, role: str, where: str) -> Any:
    """A message's content for the chat messages: a part list with media stays a list (its media parts tagged
    `where[j]`, for extract_media), anything else is flattened to text (chat.flatten_content)."""
    if isinstance(content, list) and any(is_media_part(part) for part in content):
        return tag_media_parts(content, where)
    return flatten_content(content, role=role)


@dataclass(frozen=True)
class MediaPart:
    kind: str  # "image" | "video"
    part: str  # the caller's name for the part, for errors
    location: str  # a data URL, or a local path when files are allowed


def extract_media(messages: Sequence[Mapping[str, Any]], *, allow_files: bool = False
                  ) -> tuple[list[dict[str, Any]], list[MediaPart]]:
    """The messages with every media part replaced by `{"type": "image"}` / `{"type": "video"}` (what the chat
    template reads), and the media parts in prompt order. Messages without media come back unchanged."""
    out: list[dict[str, Any]] = []
    parts: list[MediaPart] = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            out.append(message)  # type: ignore[arg-type]
            continue
        new_content = []
        for j, part in enumerate(content):
            name = part.get(PART_NAME_KEY) if isinstance(part, Mapping) else None
            found = _media_part(part, name or f"messages[{i}].content[{j}]", allow_files)
            if found is None:
                new_content.append(part)
            else:
                parts.append(found)
                new_content.append(dict(MEDIA_MARKERS[0 if found.kind == "image" else 1]))
        copied = copy.copy(dict(message))
        copied["content"] = new_content
        out.append(copied)
    return out, parts


def _media_part(part: Any, name: str, allow_files: bool) -> MediaPart | None:
    if not is_media_part(part):
        return None
    kind = part.get("type")
    if kind in ("image_url", "video_url"):
        value = part.get(kind)
        url = value.get("url") if isinstance(value, Mapping) else value
        return MediaPart(kind[: -len("_url")], name, _location(url, name, allow_files))
    if kind == "input_image":
        if part.get("file_id") is not None and part.get("image_url") is None:
            raise MediaError(name, "file_id images are not supported; send the image as a data URL")
        return MediaPart("image", name, _location(part.get("image_url"), name, allow_files))
    if kind == "image" and isinstance(part.get("source"), Mapping):
        return MediaPart("image", name, _anthropic_source(part["source"], name))
    return MediaPart(kind, name, _location(part[kind], name, allow_files))


def _location(url: Any, name: str, allow_files: bool) -> str:
    if not isinstance(url, str) or not url:
        raise MediaError(name, "the part has no URL (expected a base64 data URL)")
    if is_data_url(url):
        return url
    if url.lower().startswith(("http://", "https://")):
        raise MediaError(name, "remote URLs are not fetched; send the image or video as a base64 data URL")
    if not allow_files:
        raise MediaError(name, "not a data URL (expected data:<type>;base64,<payload>)")
    return url.removeprefix("file://")


def _anthropic_source(source: Mapping[str, Any], name: str) -> str:
    if source.get("type") != "base64":
        raise MediaError(name, f"image source type {source.get('type')!r} is not supported; send base64 data")
    data, media_type = source.get("data"), source.get("media_type", "")
    if not isinstance(data, str) or not isinstance(media_type, str):
        raise MediaError(name, "a base64 image source needs string media_type and data")
    return f"data:{media_type};base64,{data}"


def load_media(parts: Sequence[MediaPart], preprocessor: VisionPreprocessor) -> list[VisionInput]:
    """Decode and preprocess every part (MediaError naming the first bad one), then check the per-request
    limits."""
    limits: MediaLimits = preprocessor.limits
    inputs = []
    for p in parts:
        data = _read(p, limits)
        inputs.append(preprocessor.image(data, part=p.part) if p.kind == "image" else
                      preprocessor.video(data, part=p.part))
    check_request_media([i.kind for i in inputs], [i.num_tokens for i in inputs], [p.part for p in parts], limits)
    return inputs


def _read(part: MediaPart, limits: MediaLimits) -> bytes:
    if is_data_url(part.location):
        return parse_data_url(part.location, part=part.part, max_bytes=limits.max_part_bytes).data
    path = Path(part.location)
    try:
        size = path.stat().st_size
        if size > limits.max_part_bytes:
            raise MediaError(part.part, f"{path} is over the limit of {limits.max_part_bytes} bytes")
        return path.read_bytes()
    except OSError as exc:
        raise MediaError(part.part, f"cannot read {path}: {exc.strerror}") from None
