"""Vision placeholders in a tokenized prompt, and the M-RoPE (t, h, w) positions they imply (architecture
reference §7.6-7.7).

The chat template writes one `<|vision_start|><|image_pad|><|vision_end|>` per image and one
`<|vision_start|><|video_pad|><|vision_end|>` per video. `expand_placeholders` gives each image one pad token
per merge block, and replaces each video's triple by one block per temporal group,
`<{t:.1f} seconds><|vision_start|><|video_pad|>*n<|vision_end|>`, as Qwen3.5 was trained (vLLM and transformers
<= 4.57; transformers 5.23's processor keeps an extra outer start/end pair, see the reference).

Positions: text advances all three streams by one per token; a vision block of r x c merged patches starting at
position p gives its token (i, j) the positions (p, p + i, p + j) and moves p on by max(r, c). Text after the
media continues from there, so a sequence's last position is below its length: `delta` = (max position + 1) -
length, and a token generated at index k has position k + delta on all three streams.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ninfer.errors import MediaError
from ninfer.frontend.vision import VisionInput

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"


@dataclass(frozen=True)
class VisionTokenIds:
    vision_start: int
    vision_end: int
    image_pad: int
    video_pad: int

    @classmethod
    def lookup(cls, token_to_id: Callable[[str], int | None]) -> VisionTokenIds:
        ids = {name: token_to_id(token) for name, token in (
            ("vision_start", VISION_START), ("vision_end", VISION_END),
            ("image_pad", IMAGE_PAD), ("video_pad", VIDEO_PAD))}
        missing = [name for name, value in ids.items() if value is None]
        if missing:
            raise ValueError(f"the tokenizer has no vision tokens: {', '.join(missing)}")
        return cls(**ids)  # type: ignore[arg-type]


@dataclass(frozen=True)
class VisionSpan:
    """The placeholder tokens of one image, or of one temporal group of a video."""

    item: int  # index of the media input (in prompt order)
    group: int  # temporal group within a video (0 for an image)
    start: int  # position of the first pad token in the expanded prompt
    rows: int  # merged grid (patch grid / merge size)
    cols: int

    @property
    def length(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class ExpandedPrompt:
    token_ids: list[int]
    spans: tuple[VisionSpan, ...]


def expand_placeholders(token_ids: Sequence[int], inputs: Sequence[VisionInput], parts: Sequence[str],
                        ids: VisionTokenIds, encode_text: Callable[[str], list[int]]) -> ExpandedPrompt:
    """Expand one placeholder per input, taken in order (the template writes them in the order of the
    messages' parts); `parts` names each input for errors, `encode_text` tokenizes a video's timestamp text."""
    out: list[int] = []
    spans: list[VisionSpan] = []
    used = 0
    position = 0
    while position < len(token_ids):
        token = token_ids[position]
        position += 1
        if token not in (ids.image_pad, ids.video_pad):
            out.append(token)
            continue
        kind = "image" if token == ids.image_pad else "video"
        if used == len(inputs):
            raise MediaError("prompt", f"the prompt has more {kind} placeholders than the request has media")
        item, part = inputs[used], parts[used]
        if item.kind != kind:
            raise MediaError(part, f"the prompt has a {kind} placeholder where this {item.kind} belongs")
        _, height, width = item.grid_thw
        rows, cols = height // item.merge_size, width // item.merge_size
        if kind == "image":
            spans.append(VisionSpan(used, 0, len(out), rows, cols))
            out.extend([ids.image_pad] * item.tokens_per_group)
        else:
            if not out or out[-1] != ids.vision_start or position >= len(token_ids) \
                    or token_ids[position] != ids.vision_end:
                raise MediaError(part, f"the video placeholder is not {VISION_START}{VIDEO_PAD}{VISION_END}")
            out.pop()
            position += 1
            for group, seconds in enumerate(item.timestamps):
                out.extend(encode_text(f"<{seconds:.1f} seconds>"))
                out.append(ids.vision_start)
                spans.append(VisionSpan(used, group, len(out), rows, cols))
                out.extend([ids.video_pad] * item.tokens_per_group)
                out.append(ids.vision_end)
        used += 1
    if used < len(inputs):
        raise MediaError(parts[used], "the prompt has no placeholder for this part")
    return ExpandedPrompt(out, tuple(spans))


def mrope_positions(length: int, spans: Sequence[VisionSpan]) -> tuple[np.ndarray, int]:
    """([3, length] int64 positions (t, h, w), delta) for a sequence of `length` tokens whose vision tokens are
    `spans` (ascending, not overlapping)."""
    positions = np.empty((3, length), dtype=np.int64)
    index = 0  # next token
    current = 0  # next position
    for span in spans:
        if span.start < index or span.start + span.length > length:
            raise ValueError(f"vision span at {span.start} overlaps the previous one or the end")
        text = span.start - index
        positions[:, index:span.start] = np.arange(current, current + text)
        current += text
        rows, cols = np.divmod(np.arange(span.length), span.cols)
        block = positions[:, span.start:span.start + span.length]
        block[0], block[1], block[2] = current, current + rows, current + cols
        current += max(span.rows, span.cols)
        index = span.start + span.length
    positions[:, index:] = np.arange(current, current + length - index)
    delta = int(positions.max()) + 1 - length if length else 0
    return positions, delta
