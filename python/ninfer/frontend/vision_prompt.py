"""Vision placeholders in a prompt, and the M-RoPE (t, h, w) positions they imply (architecture
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

import re
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


_PLACEHOLDER = re.compile("|".join(re.escape(t) for t in (
    VISION_START + VIDEO_PAD + VISION_END, IMAGE_PAD, VIDEO_PAD)))


def expand_placeholders(text: str, inputs: Sequence[VisionInput], parts: Sequence[str], ids: VisionTokenIds,
                        encode: Callable[[str], list[int]]) -> ExpandedPrompt:
    """Expand one placeholder per input, taken in order (the template writes them in the order of the
    messages' parts), and tokenize. The expansion is textual, like HF's processor, so a timestamp merges with
    the text before it exactly as the whole prompt would tokenize. `parts` names each input for errors."""
    used = 0

    def expand(match: re.Match[str]) -> str:
        nonlocal used
        kind = "image" if match[0] == IMAGE_PAD else "video"
        if used == len(inputs):
            raise MediaError("prompt", f"the prompt has more {kind} placeholders than the request has media")
        item, part = inputs[used], parts[used]
        if item.kind != kind:
            raise MediaError(part, f"the prompt has a {kind} placeholder where this {item.kind} belongs")
        if match[0] == VIDEO_PAD:
            raise MediaError(part, f"the video placeholder is not {VISION_START}{VIDEO_PAD}{VISION_END}")
        used += 1
        if kind == "image":
            return IMAGE_PAD * item.tokens_per_group
        block = VISION_START + VIDEO_PAD * item.tokens_per_group + VISION_END
        return "".join(f"<{seconds:.1f} seconds>" + block for seconds in item.timestamps)

    token_ids = encode(_PLACEHOLDER.sub(expand, text))
    if used < len(inputs):
        raise MediaError(parts[used], "the prompt has no placeholder for this part")
    return ExpandedPrompt(token_ids, _spans(token_ids, inputs, ids))


def _spans(token_ids: Sequence[int], inputs: Sequence[VisionInput], ids: VisionTokenIds) -> tuple[VisionSpan, ...]:
    """The runs of pad tokens, matched to the inputs' groups in order."""
    expected = [(n, g, item) for n, item in enumerate(inputs) for g in range(item.grid_thw[0]
                                                                            if item.kind == "video" else 1)]
    pads = np.flatnonzero(np.isin(np.asarray(token_ids, dtype=np.int64), (ids.image_pad, ids.video_pad)))
    spans: list[VisionSpan] = []
    cursor = 0
    for n, group, item in expected:
        length = item.tokens_per_group
        start = int(pads[cursor]) if cursor < len(pads) else -1
        run_ends = cursor + length == len(pads) or pads[min(cursor + length, len(pads) - 1)] != start + length
        if start < 0 or cursor + length > len(pads) or pads[cursor + length - 1] != start + length - 1 \
                or not run_ends:
            raise MediaError("prompt", "the prompt's vision pad tokens do not match its media "
                                       "(is there a literal pad token in the text?)")
        _, height, width = item.grid_thw
        spans.append(VisionSpan(n, group, start, height // item.merge_size, width // item.merge_size))
        cursor += length
    if cursor != len(pads):
        raise MediaError("prompt", "the prompt holds vision pad tokens that belong to no media")
    return tuple(spans)


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


@dataclass(frozen=True)
class PromptMedia:
    """What the engine takes of a prompt's media: each input (patches and grid), the index of the first
    placeholder of each of its temporal groups, and the prompt's M-RoPE positions and delta."""

    inputs: tuple[VisionInput, ...]
    group_starts: tuple[tuple[int, ...], ...]
    positions: np.ndarray  # [3, prompt tokens] int64 (t, h, w)
    delta: int


def prompt_media(expanded: ExpandedPrompt, inputs: Sequence[VisionInput]) -> PromptMedia:
    """The engine's view of an expanded prompt's media (`inputs` as given to expand_placeholders)."""
    starts: list[list[int]] = [[] for _ in inputs]
    for span in expanded.spans:
        starts[span.item].append(span.start)
    positions, delta = mrope_positions(len(expanded.token_ids), expanded.spans)
    return PromptMedia(tuple(inputs), tuple(tuple(s) for s in starts), positions, delta)
