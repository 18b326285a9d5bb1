"""Whole-model logits with images and video: the CPU engine's Model (tower rows in place of the pad tokens' embeddings,
M-RoPE positions from the frontend) against HF's Qwen3_5ForConditionalGeneration on the same tiny save_pretrained
checkpoint (dense and MoE), for one image, two images, a video and a mix; prefill in one pass and in chunks that cut
through an image; decoding after the media at position index + delta."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ninfer import _testing
from ninfer.artifact.convert import convert
from tiny_models import build_tiny_checkpoint, load_reference_vlm
from vision_prompts import build_prompt, media_rows

KINDS = ["qwen3_5", "qwen3_5_moe"]
F32_KV_TOL = 1e-4  # as tests/test_model_parity.py: identical bf16 weights, f32 KV, only rounding order differs

MEDIA = {
    "one-image": [("image", (1, 8, 6))],
    "two-images": [("image", (1, 4, 4)), ("image", (1, 6, 10))],
    "video": [("video", (3, 4, 6))],
    "image-and-video": [("video", (2, 6, 4)), ("image", (1, 2, 8))],
}


@pytest.fixture(scope="module", params=KINDS)
def models(request, tiny_root, tmp_path_factory):
    folder = build_tiny_checkpoint(request.param, tiny_root)
    out = tmp_path_factory.mktemp(request.param) / "model.ninfer"
    convert(folder, out, recipe="bf16", progress=False)
    ours = _testing.Model.open(str(out), kv_dtype="f32", threads=2, max_context=1024, vision=True)
    return ours, load_reference_vlm(folder)


def patch_values(reference) -> int:
    c = reference.config.vision_config
    return c.in_channels * c.temporal_patch_size * c.patch_size ** 2


def hf_logits(reference, prompt, extra: np.ndarray | None = None) -> np.ndarray:
    """HF's logits for the prompt (and `extra` text tokens after it, in the same forward)."""
    inputs = prompt.hf_inputs()
    if extra is not None:
        tail = torch.tensor(extra[None].astype(np.int64))
        inputs["input_ids"] = torch.cat([inputs["input_ids"], tail], 1)
        inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(tail, dtype=torch.int32)], 1)
    with torch.no_grad():
        return reference(**inputs).logits[0].numpy()


def assert_close(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape and np.isfinite(ours).all()
    assert float(np.abs(ours - theirs).max()) <= F32_KV_TOL * float(np.abs(theirs).max())


@pytest.mark.parametrize("media", MEDIA.values(), ids=MEDIA.keys())
def test_prefill_logits_match_hf(models, media):
    ours, reference = models
    prompt = build_prompt(media, patch_values(reference), seed=len(media) * 7 + media[0][1][1])
    rows = media_rows(prompt, ours.encode_vision(prompt.patches, prompt.grids))
    logits = ours.prefill(ours.new_sequence(), prompt.tokens, all_logits=True, media=rows,
                          mrope_positions=prompt.positions)
    theirs = hf_logits(reference, prompt)
    assert_close(logits, theirs)
    # The media matter: the same tokens with text embeddings at the pads give other logits.
    plain = ours.prefill(ours.new_sequence(), prompt.tokens, all_logits=True, mrope_positions=prompt.positions)
    assert float(np.abs(plain - theirs).max()) > 100 * F32_KV_TOL * float(np.abs(theirs).max())
    # So do the positions: 1-D positions (index on every stream) give other logits too.
    flat = ours.prefill(ours.new_sequence(), prompt.tokens, all_logits=True, media=rows)
    assert float(np.abs(flat - theirs).max()) > 100 * F32_KV_TOL * float(np.abs(theirs).max())


def test_chunked_prefill_and_decode_after_media_match_hf(models):
    ours, reference = models
    prompt = build_prompt(MEDIA["image-and-video"], patch_values(reference), seed=3)
    rows = media_rows(prompt, ours.encode_vision(prompt.patches, prompt.grids))
    extra = np.random.default_rng(4).integers(0, 240000, 4).astype(np.int32)
    theirs = hf_logits(reference, prompt, extra)
    n = len(prompt.tokens)
    cut = prompt.spans[1].start + 3  # inside the second group's placeholders
    seq = ours.new_sequence()
    chunks = []
    for begin, end in ((0, cut), (cut, n)):
        part = [(max(first, begin) - begin, r[max(0, begin - first):max(0, min(len(r), end - first))])
                for first, r in rows if first < end and first + len(r) > begin]
        chunks.append(ours.prefill(seq, np.ascontiguousarray(prompt.tokens[begin:end]), all_logits=True,
                                   media=[(f, np.ascontiguousarray(r)) for f, r in part],
                                   mrope_positions=np.ascontiguousarray(prompt.positions[begin:end])))
    assert_close(np.concatenate(chunks), theirs[:n])
    assert prompt.delta < 0  # the media's positions advance slower than their tokens
    for i, token in enumerate(extra):
        assert_close(ours.decode(seq, int(token), position_offset=prompt.delta), theirs[n + i:n + i + 1])
