"""Every packaging test runs Nix against the session's private installation (see nixeval.py)."""

from __future__ import annotations

import pytest
from nixeval import use_private_nix


@pytest.fixture(scope="session", autouse=True)
def private_nix(tmp_path_factory: pytest.TempPathFactory) -> None:
    use_private_nix(tmp_path_factory.mktemp("nix"))
