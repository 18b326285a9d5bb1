"""Synthetic multimodal prompts for the vision parity tests: random text tokens around images and videos laid out
as the chat template and `expand_placeholders` write them, random patches, and HF's inputs for the same prompt."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from ninfer.frontend.vision_prompt import VisionSpan, mrope_positions

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 248053, 248054, 248056, 248057
TEXT_IDS = 240000  # random text tokens are drawn below the special tokens
MERGE = 2


@dataclass
class MediaPrompt:
    tokens: np.ndarray  # int32 [n]
    grids: list[tuple[int, int, int]]  # per image / video
    kinds: list[str]  # "image" | "video"
    patches: np.ndarray  # [sum of grid patches, patch values] f32, media in prompt order
    spans: list[VisionSpan]
    positions: np.ndarray  # [n, 3] int64
    delta: int

    def hf_inputs(self) -> dict:
        """Keyword arguments of HF Qwen3_5ForConditionalGeneration's forward for this prompt."""
        ids = torch.tensor(self.tokens[None].astype(np.int64))
        types = torch.zeros_like(ids, dtype=torch.int32)
        types[ids == IMAGE_PAD], types[ids == VIDEO_PAD] = 1, 2
        out = {"input_ids": ids, "mm_token_type_ids": types}
        rows = [t * h * w for t, h, w in self.grids]
        chunks = np.split(self.patches, np.cumsum(rows)[:-1])
        for kind, key in (("image", "pixel_values"), ("video", "pixel_values_videos")):
            picked = [i for i, k in enumerate(self.kinds) if k == kind]
            if picked:
                out[key] = torch.from_numpy(np.concatenate([chunks[i] for i in picked]))
                out[f"{kind}_grid_thw"] = torch.tensor([self.grids[i] for i in picked])
        return out


def build_prompt(media: list[tuple[str, tuple[int, int, int]]], patch_values: int, seed: int,
                 text_between: int = 5, text_before: int = 7) -> MediaPrompt:
    """`text_before` text tokens, then each (kind, grid) medium with `text_between` text tokens after it. A video
    gets one block per temporal group, each after a few (timestamp-like) text tokens, as expand_placeholders
    writes it."""
    rng = np.random.default_rng(seed)
    tokens = list(rng.integers(0, TEXT_IDS, text_before))
    spans = []
    for item, (kind, (t, h, w)) in enumerate(media):
        for group in range(t):
            if kind == "video":
                tokens += list(rng.integers(0, TEXT_IDS, 3))
            tokens.append(VISION_START)
            spans.append(VisionSpan(item, group, len(tokens), h // MERGE, w // MERGE))
            tokens += [IMAGE_PAD if kind == "image" else VIDEO_PAD] * (h * w // MERGE ** 2)
            tokens.append(VISION_END)
        tokens += list(rng.integers(0, TEXT_IDS, text_between))
    positions, delta = mrope_positions(len(tokens), spans)
    rows = sum(t * h * w for _, (t, h, w) in media)
    return MediaPrompt(np.asarray(tokens, dtype=np.int32), [g for _, g in media], [k for k, _ in media],
                       rng.uniform(-1, 1, (rows, patch_values)).astype(np.float32), spans,
                       np.ascontiguousarray(positions.T), delta)


def extended(prompt: MediaPrompt, text: list[int]) -> MediaPrompt:
    """The same prompt with `text` tokens after it (a later turn that sends it back with more), positions and
    delta recomputed."""
    tokens = np.concatenate([prompt.tokens, np.asarray(text, dtype=np.int32)])
    positions, delta = mrope_positions(len(tokens), prompt.spans)
    return replace(prompt, tokens=tokens, positions=np.ascontiguousarray(positions.T), delta=delta)


def media_rows(prompt: MediaPrompt, encoded: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(first token, rows) of each placeholder run, from the tower's rows for all media in order."""
    out, row = [], 0
    for span in prompt.spans:
        out.append((span.start, np.ascontiguousarray(encoded[row:row + span.length])))
        row += span.length
    assert row == len(encoded)
    return out
