"""Running Nix 2.8 (Debian's `nix-bin`) offline from tests: evaluate expressions, build stand-ins, copy the flake.

Every helper raises `NixError` with Nix's own message when the command fails, so a test can assert on it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
STUB_NIXPKGS = REPO / "nix" / "tests" / "stub-nixpkgs"
FLAKE_FEATURES = ["--extra-experimental-features", "nix-command flakes"]
# What a flake copy needs: everything flake.nix and nix/ read at evaluation time.
FLAKE_PATHS = ["flake.nix", "flake.lock", "nix", "pyproject.toml", "requirements", "python/ninfer/systemd_hardening.json"]

needs_nix = pytest.mark.skipif(
    shutil.which("nix-instantiate") is None or shutil.which("nix") is None,
    reason="Nix is not installed (CI: `apt-get install -y nix-bin`, Debian's Nix 2.8)",
)
needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (CI: `apt-get install -y systemd`)",
)


class NixError(Exception):
    """A Nix command failed; the message is its stderr."""


def _run(argv: list[str], cwd: Path = REPO) -> str:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise NixError(result.stderr.strip())
    return result.stdout


def eval_json(expression: str) -> Any:
    """Evaluate a Nix expression (paths relative to the repo root) strictly and return it as JSON."""
    return json.loads(_run(["nix-instantiate", *FLAKE_FEATURES, "--eval", "--strict", "--json", "--read-write-mode", "--expr", expression]))


def build(expression: str) -> Path:
    """Build a derivation offline and return its output path."""
    return Path(_run(["nix-build", "--no-out-link", "--expr", expression]).strip())


def realise(derivation: str) -> Path:
    """Build a .drv offline and return its output path."""
    return Path(_run(["nix-store", "--realise", derivation]).strip())


def parse(path: Path) -> None:
    _run(["nix-instantiate", "--parse", str(path)])


def nix(args: list[str], cwd: Path) -> str:
    return _run(["nix", "--offline", *FLAKE_FEATURES, *args], cwd=cwd)


def copy_flake(destination: Path) -> Path:
    """A copy of the flake without the rest of the working tree (a `path:` flake copies the whole folder)."""
    destination.mkdir(parents=True)
    for name in FLAKE_PATHS:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, destination / name)
        else:
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def nixos_eval(services_ninfer: str, extra_modules: str = "") -> Any:
    """Evaluate nix/module.nix with the stub NixOS for the given `services.ninfer = { ... }` body."""
    return eval_json(
        f"""
        let
          lib = import ./nix/tests/stub-nixpkgs/lib.nix;
          # As with the flake's overlay applied: pkgs.ninfer is the package (here its stand-in).
          pkgs = import ./nix/tests/stub-nixpkgs {{ }} // {{ ninfer = import ./nix/tests/stub-nixpkgs/package.nix {{ }}; }};
          system = import ./nix/tests/stub-nixpkgs/nixos.nix {{
            inherit pkgs;
            modules = [ ./nix/module.nix {{ services.ninfer = {{ {services_ninfer} }}; }} {extra_modules} ];
          }};
          # As NixOS does, report failed assertions instead of building anything.
          ok = system.failedAssertions == [ ];
          service = if ok then system.config.systemd.services.ninfer or null else null;
        in {{
          inherit (system) failedAssertions;
          inherit service;
          unitText = if ok then system.unitTexts.ninfer or null else null;
          firewall = system.config.networking.firewall.allowedTCPPorts;
          inherit (system.config) users;
        }}
        """
    )
