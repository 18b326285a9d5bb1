"""Artifacts the runtime, engine-API and CLI tests share, built once per session (cached in the pytest cache).

- tiny_llama_artifact / tiny_qwen35_artifact: bf16 artifacts of the tiny random checkpoints (token ids only for
  llama; the real 248k tokenizer for Qwen3.5), exercising KV pages and, for Qwen3.5, per-lane GDN state slots.
- smollm2_default_artifact: the embedded default model in the session's cache home (`smollm2_cache_home`,
  tests/conftest.py).
- smollm2_bf16_artifact: SmolLM2 with bf16 weights, for parity with HF transformers on the same values.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ninfer.artifact.convert import convert
from ninfer.default_model import default_model_path


def _converted(pytestconfig: pytest.Config, src: Path, recipe: str) -> Path:
    folder = Path(pytestconfig.cache.mkdir("runtime-artifacts"))
    out = folder / f"{Path(src).name}.{recipe}.ninfer"
    if not out.exists():  # sources are named by seed and builder version (or are a pinned file): never stale
        convert(src, out, recipe=recipe, progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_llama_artifact(pytestconfig, tiny_llama) -> Path:
    return _converted(pytestconfig, tiny_llama, "bf16")


@pytest.fixture(scope="session")
def tiny_qwen35_artifact(pytestconfig, tiny_qwen3_5) -> Path:
    return _converted(pytestconfig, tiny_qwen3_5, "bf16")


@pytest.fixture(scope="session")
def smollm2_default_artifact(smollm2_cache_home) -> Path:
    return default_model_path(progress=False, folder=smollm2_cache_home / "ninfer")


@pytest.fixture(scope="session")
def smollm2_bf16_artifact(pytestconfig, smollm2_gguf) -> Path:
    return _converted(pytestconfig, smollm2_gguf, "bf16")


@pytest.fixture(scope="session")
def tiny_qwen35_moe_artifact(pytestconfig, tiny_qwen3_5_moe) -> Path:
    return _converted(pytestconfig, tiny_qwen3_5_moe, "bf16")
