"""GPU tests run on the accelerator machine (`make gpu-test`); elsewhere they skip and say why."""

from __future__ import annotations

import pytest
from ninfer import _testing


def _gpu_unavailable_reason() -> str | None:
    if not _testing.cuda.built:
        return "this build of ninfer._engine has no CUDA backend (no nvcc at build time, or NINFER_CUDA=OFF)"
    if _testing.cuda.device_count() == 0:
        return "no usable CUDA device on this machine"
    return None


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory):
    """Tiny random Qwen3.5 dense and MoE checkpoints (tests/tiny_models.py) converted to bf16 artifacts."""
    from ninfer.artifact.convert import convert
    from tiny_models import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for kind in ("qwen3_5", "qwen3_5_moe"):
        src = build_tiny_checkpoint(kind, root)
        out[kind] = root / f"{kind}.bf16.ninfer"
        convert(src, out[kind], recipe="bf16", progress=False)
    return out


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _gpu_unavailable_reason()
    for item in items:
        if "gpu" in item.keywords and reason:
            item.add_marker(pytest.mark.skip(reason=reason))
