"""Fixtures of the router and web UI tests (helpers in tests/live_servers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from live_servers import artifact_for


@pytest.fixture(scope="session")
def smollm2(pytestconfig, smollm2_gguf) -> Path:
    """SmolLM2-135M-Instruct (bf16): a real chat model whose 49k tokenizer loads in seconds on two cores. The router
    tests serve it under two names with different engine presets: two engines, swapped like two models."""
    return artifact_for(pytestconfig, smollm2_gguf)
