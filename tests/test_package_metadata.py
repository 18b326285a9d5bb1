"""pyproject.toml's dependencies are what an installed ninfer gets (`pip install .`, and the Nix package,
which reads them): they must name every package requirements/runtime.txt pins for running and serving, or an
install that is not a `make build` checkout fails at its first import (as it did for llguidance)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    """PEP 503-normalised project name of a PEP 508 requirement."""
    match = re.match(r"\s*([A-Za-z0-9._-]+)", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def test_pyproject_dependencies_cover_the_runtime_requirements():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    lines = (REPO / "requirements" / "runtime.txt").read_text().splitlines()
    pinned = {_name(line) for line in lines if line.strip() and not line.lstrip().startswith(("#", "-"))}
    assert pinned, "requirements/runtime.txt names no package"
    assert pinned - declared == set(), "pinned in requirements/runtime.txt but missing from pyproject.toml"
