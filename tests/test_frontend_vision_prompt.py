"""Placeholder expansion and M-RoPE positions (ninfer.frontend.vision_prompt) against HF transformers: the
expanded prompt equals the real tokenizer's encoding of the text HF's Qwen3-VL processor writes for each image
and video (the whole video triple replaced, as Qwen3.5 was trained; see the module's note), and the positions
equal HF Qwen3.5's `get_rope_index` on that sequence."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from vision_media import TINY_IMAGE_CONFIG, TINY_VIDEO_CONFIG, encode_image, random_pixels, random_video  # noqa: E402

from ninfer.errors import MediaError  # noqa: E402
from ninfer.frontend.vision import VisionPreprocessor, sample_frame_indices  # noqa: E402
from ninfer.frontend.vision_prompt import (  # noqa: E402
    IMAGE_PAD,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    VisionTokenIds,
    expand_placeholders,
    mrope_positions,
)

transformers = pytest.importorskip("transformers")
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor  # noqa: E402
from transformers.video_utils import VideoMetadata  # noqa: E402

IMAGE = VISION_START + IMAGE_PAD + VISION_END
VIDEO = VISION_START + VIDEO_PAD + VISION_END


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer

    from ninfer.artifact.tokenizer_build import qwen35_tokenizer_json

    return Tokenizer.from_str(qwen35_tokenizer_json())


@pytest.fixture(scope="module")
def hf_model():
    """A tiny Qwen3.5 VLM: get_rope_index reads only the vision config's merge size."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "layer_types": ["full_attention"],
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 32,
            "linear_num_key_heads": 1, "linear_num_value_heads": 1, "linear_key_head_dim": 8,
            "linear_value_head_dim": 8}
    vision = {"depth": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32, "patch_size": 4,
              "out_hidden_size": 32, "num_position_embeddings": 16}
    config = Qwen3_5Config(text_config=text, vision_config=vision)
    return Qwen3_5ForConditionalGeneration(config).model


# (total frames, fps) of each synthetic video, so the HF oracle gets the same metadata.
VIDEO_SHAPES = [(23, 10, 40, 56), (9, 6, 128, 96)]


def _media(seed: int):
    rng = np.random.default_rng(seed)
    preprocessor = VisionPreprocessor.from_configs(TINY_IMAGE_CONFIG, TINY_VIDEO_CONFIG)
    images = [preprocessor.image(encode_image(random_pixels(rng, h, w), "PNG"), part=f"image{i}")
              for i, (h, w) in enumerate([(48, 64), (150, 40), (32, 32)])]
    videos = [preprocessor.video(random_video(rng, n, h, w, fps), part=f"video{i}")
              for i, (n, fps, h, w) in enumerate(VIDEO_SHAPES)]
    metadata = [VideoMetadata(total_num_frames=n, fps=float(fps), frames_indices=sample_frame_indices(
        n, fps, preprocessor.video_settings, preprocessor.limits.max_video_frames)) for n, fps, _, _ in VIDEO_SHAPES]
    return images, videos, metadata


def _hf_video_text(video, metadata) -> str:
    """HF Qwen3-VL processor's text for one video (its replace_video_token, on a stand-in `self` that holds
    only what the method reads)."""
    owner = SimpleNamespace(
        video_processor=SimpleNamespace(merge_size=video.merge_size, temporal_patch_size=2),
        vision_start_token=VISION_START, vision_end_token=VISION_END, video_token=VIDEO_PAD,
        _calculate_timestamps=lambda *args: Qwen3VLProcessor._calculate_timestamps(None, *args))
    inputs = {"video_grid_thw": torch.tensor([video.grid_thw]), "video_metadata": [metadata]}
    return Qwen3VLProcessor.replace_video_token(owner, inputs, 0)


def _expand(tokenizer, text: str, inputs, parts):
    ids = VisionTokenIds.lookup(tokenizer.token_to_id)
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False).ids  # noqa: E731
    return expand_placeholders(text, inputs, parts, ids, encode), ids, encode


def test_expansion_and_positions_equal_hf(tokenizer, hf_model) -> None:
    images, videos, metadata = _media(0)
    # Text, media back to back, a video between images, and media at both ends.
    order = [("image", 0), ("video", 0), ("image", 1), ("video", 1), ("image", 2)]
    pieces = [IMAGE, "<|im_start|>user\nLook:", VIDEO, " then ", IMAGE, VIDEO, IMAGE, " done.<|im_end|>"]
    text = "".join(pieces)
    inputs = [images[i] if kind == "image" else videos[i] for kind, i in order]
    expanded, ids, encode = _expand(tokenizer, text, inputs, [f"{k}{i}" for k, i in order])

    hf_text, media = "", iter(order)
    for piece in pieces:
        if piece in (IMAGE, VIDEO):
            kind, i = next(media)
            piece = VISION_START + IMAGE_PAD * images[i].num_tokens + VISION_END if kind == "image" \
                else _hf_video_text(videos[i], metadata[i])
        hf_text += piece
    assert expanded.token_ids == encode(hf_text)

    tokens = torch.tensor([expanded.token_ids])
    types = torch.zeros_like(tokens)
    types[tokens == ids.image_pad], types[tokens == ids.video_pad] = 1, 2
    hf_positions, hf_delta = hf_model.get_rope_index(
        tokens, types, image_grid_thw=torch.tensor([im.grid_thw for im in images]),
        video_grid_thw=torch.tensor([v.grid_thw for v in videos]))
    positions, delta = mrope_positions(len(expanded.token_ids), expanded.spans)
    np.testing.assert_array_equal(positions, hf_positions[:, 0].numpy())
    assert delta == int(hf_delta) and delta < 0
    assert sum(s.length for s in expanded.spans) == sum(x.num_tokens for x in inputs)


def test_text_only_positions_are_plain(tokenizer) -> None:
    positions, delta = mrope_positions(7, ())
    np.testing.assert_array_equal(positions, np.tile(np.arange(7), (3, 1)))
    assert delta == 0


def test_placeholder_mismatches_name_the_part(tokenizer) -> None:
    images, videos, _ = _media(1)
    with pytest.raises(MediaError, match="no placeholder") as caught:
        _expand(tokenizer, "hi " + IMAGE, [images[0], images[1]], ["a", "b"])
    assert caught.value.part == "b"
    with pytest.raises(MediaError, match="more image placeholders"):
        _expand(tokenizer, IMAGE + IMAGE, [images[0]], ["a"])
    with pytest.raises(MediaError, match="video placeholder where this image belongs"):
        _expand(tokenizer, VIDEO, [images[0]], ["a"])
    with pytest.raises(MediaError, match="is not"):
        _expand(tokenizer, "x" + VIDEO_PAD + VISION_END, [videos[0]], ["a"])
    ids = VisionTokenIds.lookup(tokenizer.token_to_id)

    def losing_a_pad(text: str) -> list[int]:  # a tokenizer that does not keep every pad as one token
        tokens = tokenizer.encode(text, add_special_tokens=False).ids
        tokens.remove(ids.image_pad)
        return tokens

    with pytest.raises(MediaError, match="do not match its media"):
        expand_placeholders(IMAGE + IMAGE, images[:2], ["a", "b"], ids, losing_a_pad)
