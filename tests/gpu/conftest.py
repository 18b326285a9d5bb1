"""GPU tests run on the accelerator machine (`make gpu-test`); elsewhere they skip and say why."""

from __future__ import annotations

import pytest

from ninfer import _engine


def _gpu_unavailable_reason() -> str | None:
    if not _engine.cuda.built:
        return "this build of ninfer._engine has no CUDA backend (no nvcc at build time, or NINFER_CUDA=OFF)"
    if _engine.cuda.device_count() == 0:
        return "no usable CUDA device on this machine"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _gpu_unavailable_reason()
    for item in items:
        if "gpu" in item.keywords and reason:
            item.add_marker(pytest.mark.skip(reason=reason))
