"""Images and video through the engine (requests carry media; the tower runs at the request's first prefill chunk;
chunks cut through the media; decode positions continue at index + delta): greedy tokens equal HF
Qwen3_5ForConditionalGeneration's greedy continuation, and the engine refuses media it cannot take."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from engine_helpers import run_alone, run_together
from ninfer import errors
from ninfer.artifact.convert import convert
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams
from ninfer.frontend.vision import VisionInput
from ninfer.frontend.vision_prompt import PromptMedia
from prefix_cache_checks import assert_same, run_one
from tiny_models import build_tiny_checkpoint, load_reference_vlm
from vision_prompts import MERGE, build_prompt, extended

MEDIA = [("image", (1, 16, 12)), ("video", (2, 6, 8))]  # 72 placeholder tokens: the 64-token chunks cut them
NEW_TOKENS = 5


@pytest.fixture(scope="module")
def checkpoint(tiny_root, tmp_path_factory):
    folder = build_tiny_checkpoint("qwen3_5", tiny_root)
    out = tmp_path_factory.mktemp("vision-engine") / "model.ninfer"
    convert(folder, out, recipe="bf16", progress=False)
    return out, load_reference_vlm(folder)


def patch_values(reference) -> int:
    c = reference.config.vision_config
    return c.in_channels * c.temporal_patch_size * c.patch_size ** 2


def engine_media(prompt) -> PromptMedia:
    rows = np.cumsum([t * h * w for t, h, w in prompt.grids])[:-1]
    inputs = tuple(VisionInput(kind, pixels, grid, MERGE) for kind, pixels, grid in
                   zip(prompt.kinds, np.split(prompt.patches, rows), prompt.grids, strict=True))
    starts = tuple(tuple(s.start for s in prompt.spans if s.item == i) for i in range(len(inputs)))
    return PromptMedia(inputs, starts, np.ascontiguousarray(prompt.positions.T), prompt.delta)


def hf_greedy(reference, prompt, n: int) -> list[int]:
    inputs = prompt.hf_inputs()
    out = []
    for _ in range(n):
        with torch.no_grad():
            token = int(reference(**inputs).logits[0, -1].argmax())
        out.append(token)
        tail = torch.tensor([[token]])
        inputs["input_ids"] = torch.cat([inputs["input_ids"], tail], 1)
        inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(tail, dtype=torch.int32)], 1)
    return out


def greedy(prompt, media):
    return Request(prompt.tokens.tolist(), SamplingParams(temperature=0), max_new_tokens=NEW_TOKENS,
                   stop_token_ids=(), media=media)


def test_greedy_tokens_with_media_equal_hf(checkpoint):
    path, reference = checkpoint
    prompt = build_prompt(MEDIA, patch_values(reference), seed=21)
    assert len(prompt.tokens) > 64
    options = EngineOptions(backend="cpu", max_context=256, prefill_chunk=64, kv_dtype="f32", threads=2, vision=True)
    with Engine.open_sync(path, options) as engine:
        assert engine.info.modalities == ("text", "image", "video")
        assert engine.memory_plan()["vision_weights"] > 0
        ours, text_only = run_alone(engine, [greedy(prompt, engine_media(prompt)), greedy(prompt, None)])
    assert ours == hf_greedy(reference, prompt, NEW_TOKENS)
    assert ours != text_only  # the media changed the answer (a test that ignored them could not pass)


def test_media_without_vision_is_refused_naming_the_flag(checkpoint):
    path, reference = checkpoint
    prompt = build_prompt(MEDIA[:1], patch_values(reference), seed=2)
    with Engine.open_sync(path, EngineOptions(backend="cpu", max_context=256, threads=2)) as engine:
        assert engine.info.modalities == ("text",)
        with pytest.raises(errors.EngineError, match="need --vision"):
            run_alone(engine, [greedy(prompt, engine_media(prompt))])


def test_media_that_does_not_fit_the_prompt_is_refused(checkpoint):
    path, reference = checkpoint
    prompt = build_prompt(MEDIA[:1], patch_values(reference), seed=5)
    media = engine_media(prompt)
    options = EngineOptions(backend="cpu", max_context=256, threads=2, vision=True)
    moved = PromptMedia(media.inputs, ((media.group_starts[0][0] - 1,),), media.positions, media.delta)
    short = PromptMedia(media.inputs, media.group_starts, media.positions[:, :-1].copy(), media.delta)
    stray_tokens = prompt.tokens.tolist()
    stray_tokens[0] = stray_tokens[prompt.spans[0].start]  # a pad token in the text before the image
    stray = Request(stray_tokens, max_new_tokens=1, media=media)
    with Engine.open_sync(path, options) as engine:
        with pytest.raises(errors.EngineError, match="is not an image or video pad token"):
            run_alone(engine, [greedy(prompt, moved)])
        with pytest.raises(errors.EngineError, match=r"positions must be \[\d+ prompt tokens\]\[3\]"):
            run_alone(engine, [greedy(prompt, short)])
        with pytest.raises(errors.EngineError, match="prompt token 0 is a vision pad token of no medium"):
            run_alone(engine, [stray])


def test_speculative_engine_decodes_media_prompts_plainly_and_text_ones_with_drafts(checkpoint):
    # The MTP head's catch-up runs on 1-D positions, so a prompt with media (M-RoPE positions) never drafts; its
    # tokens stay HF's, while a text prompt beside it in the same engine drafts.
    path, reference = checkpoint
    prompt = build_prompt(MEDIA, patch_values(reference), seed=33)
    options = EngineOptions(backend="cpu", max_context=256, prefill_chunk=64, kv_dtype="f32", threads=2, vision=True,
                            max_concurrency=2, spec="mtp", draft_tokens=2)
    with Engine.open_sync(path, options) as engine:
        (media_tokens, media_last), (_, text_last) = run_together(
            engine, [greedy(prompt, engine_media(prompt)), greedy(prompt, None)])
    assert media_tokens == hf_greedy(reference, prompt, NEW_TOKENS)
    assert media_last.timings.draft_n == 0
    assert text_last.timings.draft_n > 0


# The prefix cache with media: a snapshot at every block boundary, so a reuse stops exactly where the blocks differ.
CACHE_OPTIONS = {"backend": "cpu", "max_context": 512, "prefill_chunk": 64, "kv_dtype": "f32", "threads": 2,
                 "vision": True, "snapshot_interval": 64, "device_state_slots": 32}


def scored(prompt, media):
    return Request(prompt.tokens.tolist(), SamplingParams(temperature=0), max_new_tokens=NEW_TOKENS,
                   stop_token_ids=(), top_logprobs=3, media=media)


def test_the_same_media_again_is_served_from_the_cache_and_other_pixels_are_not(checkpoint):
    # The same token ids behind other pixels: the blocks before the first medium's block are shared, none after.
    path, reference = checkpoint
    prompt = build_prompt(MEDIA, patch_values(reference), seed=41, text_before=70, text_between=40)
    other = replace(prompt, patches=np.random.default_rng().uniform(-1, 1, prompt.patches.shape).astype(np.float32))
    with Engine.open_sync(path, EngineOptions(**CACHE_OPTIONS, prefix_cache=False)) as off:
        ref_same, ref_other = (run_one(off, scored(p, engine_media(p)))[0] for p in (prompt, other))
    with Engine.open_sync(path, EngineOptions(**CACHE_OPTIONS)) as on:
        runs = [run_one(on, scored(p, engine_media(p))) for p in (prompt, prompt, other, prompt)]
    n, first_medium = len(prompt.tokens), prompt.spans[0].start
    assert first_medium >= 64
    reused = (n - 1) // 64 * 64
    assert [last.usage.cached_tokens for _, last in runs] == [0, reused, first_medium // 64 * 64, reused]
    for (got, _), ref in zip(runs, [ref_same, ref_same, ref_other, ref_same], strict=True):
        assert_same(got, ref)
    assert ref_same[1] != ref_other[1]  # the pixels change the answer's logprobs


def test_media_in_a_later_turn_reuses_the_text_before_it_and_then_itself(checkpoint):
    path, reference = checkpoint
    rng = np.random.default_rng()
    with_image = build_prompt(MEDIA[:1], patch_values(reference), seed=43, text_before=150, text_between=20)
    text_before = with_image.tokens[:with_image.spans[0].start - 1]  # up to the vision start marker
    later = extended(with_image, rng.integers(0, 240000, 50).tolist())
    turns = [Request(text_before.tolist(), SamplingParams(temperature=0), max_new_tokens=NEW_TOKENS,
                     stop_token_ids=(), top_logprobs=3),
             scored(with_image, engine_media(with_image)), scored(later, engine_media(later))]
    with Engine.open_sync(path, EngineOptions(**CACHE_OPTIONS, prefix_cache=False)) as off:
        reference_runs = [run_one(off, r)[0] for r in turns]
    with Engine.open_sync(path, EngineOptions(**CACHE_OPTIONS)) as on:
        runs = [run_one(on, r) for r in turns]
    assert [last.usage.cached_tokens for _, last in runs] == [
        0, len(text_before) // 64 * 64, len(with_image.tokens) // 64 * 64]
    assert len(with_image.tokens) // 64 * 64 > with_image.spans[0].start  # the third turn reused the image's blocks
    for (got, _), ref in zip(runs, reference_runs, strict=True):
        assert_same(got, ref)
