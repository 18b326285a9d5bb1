"""The converter carries a Qwen3.5 checkpoint's vision tower: its config (HF's `vision_config` plus the placeholder
token ids) into the manifest, and every `model.visual.*` weight, value for value, as HF's save_pretrained wrote it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from ninfer import _engine
from ninfer.artifact.convert import convert
from tiny_models import build_tiny_checkpoint, load_reference_vlm

KINDS = ["qwen3_5", "qwen3_5_moe"]


@pytest.fixture(scope="module", params=KINDS)
def converted(request, tiny_root, tmp_path_factory):
    folder = build_tiny_checkpoint(request.param, tiny_root)
    out = tmp_path_factory.mktemp(request.param) / "model.ninfer"
    convert(folder, out, recipe="bf16", progress=False)
    return folder, out


def test_the_manifest_holds_the_vision_config(converted):
    folder, out = converted
    hf = json.loads((folder / "config.json").read_text())
    vision = json.loads(_engine.Artifact.open(str(out)).manifest_json())["config"]["vision"]
    for key in ("depth", "hidden_size", "hidden_act", "intermediate_size", "num_heads", "in_channels", "patch_size",
                "spatial_merge_size", "temporal_patch_size", "out_hidden_size", "num_position_embeddings"):
        assert vision[key] == hf["vision_config"][key], key
    assert vision["rope_theta"] == hf["vision_config"].get("rope_parameters", {}).get("rope_theta", 10000.0)
    for key in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
        assert vision[key] == hf[key], key


def test_every_tower_weight_is_carried_exactly(converted):
    folder, out = converted
    reference = {name[len("model.visual."):]: value.numpy()
                 for name, value in load_reference_vlm(folder).state_dict().items()
                 if name.startswith("model.visual.")}
    artifact = _engine.Artifact.open(str(out))
    carried = {name[len("visual."):] for name in artifact.tensor_names() if name.startswith("visual.")}
    assert carried == set(reference)
    for name, value in reference.items():
        ours = np.asarray(artifact.dequantize("visual." + name))
        assert ours.shape == value.shape, name
        assert np.array_equal(ours, value), name


def test_a_text_only_checkpoint_has_no_vision_config(tiny_root, tmp_path):
    out = tmp_path / "llama.ninfer"
    convert(build_tiny_checkpoint("llama", tiny_root), out, recipe="bf16", progress=False)
    assert json.loads(_engine.Artifact.open(str(out)).manifest_json())["config"].get("vision") is None
