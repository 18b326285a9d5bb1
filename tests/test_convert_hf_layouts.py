"""The checkpoint layout that is published: tiny Qwen3.5 / Qwen3.5-MoE written by transformers' save_pretrained
(sharded with an index, experts one tensor per expert, VLM prefix, vision tower, MTP in its own shard) converts, keeps
its MTP and vision tensors, and the engine's logits match HF's from_pretrained of the same folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from ninfer import _engine, _testing
from ninfer.artifact.convert import convert
from ninfer.errors import ConversionError
from tiny_models import build_tiny_checkpoint, load_reference_vlm

KINDS = ["qwen3_5", "qwen3_5_moe"]
F32_KV_TOL = 1e-4  # as tests/test_model_parity.py: identical bf16 weights, only f32 rounding order differs


@pytest.fixture(scope="module", params=KINDS)
def saved(request, tiny_root) -> tuple[str, Path]:
    return request.param, build_tiny_checkpoint(request.param, tiny_root)


def weight_map(folder: Path) -> dict[str, str]:
    return json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]


def test_save_pretrained_writes_the_published_layout(saved):
    kind, folder = saved
    names = weight_map(folder)
    assert len(set(names.values())) >= 3, "expected several shards"
    assert any(n.startswith("model.language_model.layers.") for n in names)
    assert any(n.startswith("model.visual.") for n in names) and any(n.startswith("mtp.") for n in names)
    if kind == "qwen3_5_moe":
        assert "model.language_model.layers.0.mlp.experts.7.gate_proj.weight" in names
        assert not any(n.endswith("experts.gate_up_proj") for n in names)


def test_saved_layout_converts_and_matches_hf(saved, tmp_path):
    kind, folder = saved
    out = tmp_path / "model.ninfer"
    convert(folder, out, recipe="bf16", progress=False)
    bindings = set(_engine.Artifact.open(str(out)).tensor_names())
    assert {"mtp.fc", "mtp.norm"} <= bindings and any(b.startswith("visual.") for b in bindings)
    if kind == "qwen3_5_moe":
        assert "layers.0.moe.experts_gate" in bindings and "mtp.layers.0.moe.experts_down" in bindings

    tokens = np.random.default_rng(7).integers(0, 248320, 40).astype(np.int32)
    model = _testing.Model.open(str(out), kv_dtype="f32", threads=2, max_context=512)
    ours = model.prefill(model.new_sequence(), tokens, all_logits=True)
    reference = load_reference_vlm(folder)
    with torch.no_grad():
        theirs = reference(torch.tensor(tokens[None].astype(np.int64))).logits[0].numpy()
    assert ours.shape == theirs.shape and np.isfinite(ours).all()
    scale = float(np.abs(theirs).max())
    assert float(np.abs(ours - theirs).max()) <= F32_KV_TOL * scale


def test_an_index_that_disagrees_with_the_shards_is_refused(saved, tmp_path):
    _, folder = saved
    copy = Path(shutil.copytree(folder, tmp_path / "copy"))
    index = json.loads((copy / "model.safetensors.index.json").read_text())
    name = next(n for n in index["weight_map"] if n.startswith("mtp."))
    index["weight_map"][name] = "model-00001-of-00003.safetensors"
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConversionError, match="disagrees with the shards"):
        convert(copy, tmp_path / "out.ninfer", recipe="bf16", progress=False)
    index["weight_map"][name] = "model-00009-of-00009.safetensors"
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConversionError, match="names shards that are not there: model-00009-of-00009"):
        convert(copy, tmp_path / "out.ninfer", recipe="bf16", progress=False)
