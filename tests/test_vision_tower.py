"""The CPU engine's vision tower against HF's `Qwen3_5VisionModel` (the `model.visual` of HF's from_pretrained of a
tiny save_pretrained checkpoint, dense and MoE): images and videos of several grids, alone and together (the
attention must stay inside each image / frame group), and the tower's refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ninfer import _testing
from ninfer.artifact.convert import convert
from ninfer.errors import EngineError
from tiny_models import build_tiny_checkpoint, load_reference_vlm

KINDS = ["qwen3_5", "qwen3_5_moe"]
# Identical bf16 weights on both sides; only f32 rounding order differs (attention sums, GELU, LayerNorm): seen
# ~1e-7 of the largest output. Tight, because the tiny tower's attention moves its outputs by only ~1e-3 of it.
TOL = 1e-5


@pytest.fixture(scope="module", params=KINDS)
def tower(request, tiny_root, tmp_path_factory):
    folder = build_tiny_checkpoint(request.param, tiny_root)
    out = tmp_path_factory.mktemp(request.param) / "model.ninfer"
    convert(folder, out, recipe="bf16", progress=False)
    model = _testing.Model.open(str(out), threads=2, max_context=512, vision=True)
    return out, model, load_reference_vlm(folder).model.visual


def hf_encode(visual, patches: np.ndarray, grids: list[tuple[int, int, int]]) -> np.ndarray:
    with torch.no_grad():
        return visual(torch.from_numpy(patches), torch.tensor(grids)).pooler_output.numpy()


def random_patches(visual, grids, seed: int) -> np.ndarray:
    c = visual.config
    width = c.in_channels * c.temporal_patch_size * c.patch_size ** 2
    rows = sum(t * h * w for t, h, w in grids)
    return np.random.default_rng(seed).uniform(-1, 1, (rows, width)).astype(np.float32)


def assert_close(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape and np.isfinite(ours).all()
    assert float(np.abs(ours - theirs).max()) <= TOL * float(np.abs(theirs).max())


# Square and oblong grids, larger and smaller than the 4x4 position table, and videos of 2 and 3 groups.
GRIDS = [[(1, 4, 4)], [(1, 2, 6)], [(1, 8, 6)], [(1, 10, 4)], [(2, 4, 6)], [(3, 2, 2)]]


@pytest.mark.parametrize("grids", GRIDS, ids=lambda g: "x".join(map(str, g[0])))
def test_one_image_or_video_matches_hf(tower, grids):
    _, model, visual = tower
    patches = random_patches(visual, grids, seed=sum(sum(g) for g in grids))
    assert_close(model.encode_vision(patches, grids), hf_encode(visual, patches, grids))


def test_several_media_in_one_call_match_hf_and_stay_apart(tower):
    _, model, visual = tower
    grids = [(1, 4, 4), (2, 2, 6), (1, 6, 2)]
    patches = random_patches(visual, grids, seed=11)
    together = model.encode_vision(patches, grids)
    assert_close(together, hf_encode(visual, patches, grids))
    # Each medium alone gives the same rows: no attention across images.
    row = token = 0
    for t, h, w in grids:
        alone = model.encode_vision(np.ascontiguousarray(patches[row:row + t * h * w]), [(t, h, w)])
        np.testing.assert_allclose(together[token:token + len(alone)], alone, rtol=0, atol=1e-5)
        row, token = row + t * h * w, token + len(alone)
    assert token == len(together)


def test_bad_grids_are_refused(tower):
    _, model, visual = tower
    patches = random_patches(visual, [(1, 4, 4)], seed=3)
    with pytest.raises(EngineError, match="hold 32 patches, the input 16"):
        model.encode_vision(patches, [(2, 4, 4)])
    with pytest.raises(EngineError, match="multiples of 2"):
        model.encode_vision(patches[:12].copy(), [(1, 3, 4)])


def test_the_tower_loads_only_when_asked(tower, tiny_root, tmp_path):
    out, _, visual = tower
    text_only = _testing.Model.open(str(out), threads=2, max_context=256)
    with pytest.raises(EngineError, match="vision tower is not loaded"):
        text_only.encode_vision(random_patches(visual, [(1, 2, 2)], seed=1), [(1, 2, 2)])
    llama = tmp_path / "llama.ninfer"
    convert(build_tiny_checkpoint("llama", tiny_root), llama, recipe="bf16", progress=False)
    with pytest.raises(EngineError, match="has no vision tower"):
        _testing.Model.open(str(llama), threads=2, max_context=256, vision=True)


def test_op_times_are_a_cuda_mode(tower):
    """Model.open(op_times=True) (bench/vision_tower.py --op-times) times a CUDA backend's ops: the CPU backend
    refuses it, and a model opened without it reports no times (tests/gpu/test_cuda_vision.py times an encode)."""
    out, model, _ = tower
    assert model.op_times() == {}
    with pytest.raises(EngineError, match="op times need the cuda backend"):
        _testing.Model.open(str(out), threads=2, max_context=256, op_times=True)
