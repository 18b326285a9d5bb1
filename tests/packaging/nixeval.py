"""Running Nix 2.8 (Debian's `nix-bin`) offline from tests: evaluate expressions, build stand-ins, copy the flake.

Every helper raises `NixError` with Nix's own message when the command fails, so a test can assert on it.

The helpers never use the machine's Nix setup: a fresh `apt-get install nix-bin` has no `nixbld` group (the
compiled-in `build-users-group` for root), a non-root user cannot write /nix, and a machine with a daemon would
build through it. Every command runs against a private Nix under one folder (`use_private_nix`, which
tests/packaging/conftest.py calls once per session): its own store, state and log directories, its own nix.conf
(no build users, no sandbox, since the stand-ins build with the host's /bin/sh and systemd-analyze, no
substituters, no daemon) and its own cache and home, with every variable from the caller's environment that would
change that (NIX_CONFIG, NIX_REMOTE, NIX_USER_CONF_FILES, ...) replaced.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
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


# The whole configuration of the private Nix (NIX_CONF_DIR/nix.conf; no user or NIX_CONFIG files are read).
PRIVATE_NIX_CONF = """\
build-users-group =
sandbox = false
substituters =
store = local
flake-registry = {root}/flake-registry.json
"""


class NixError(Exception):
    """A Nix command failed; the message is its stderr."""


@dataclass(frozen=True)
class PrivateNix:
    """A Nix installation of the tests' own under `root`, used by every helper here."""

    root: Path

    @property
    def store_dir(self) -> Path:
        return self.root / "store"

    def environment(self, inherited: dict[str, str]) -> dict[str, str]:
        """`inherited` (the caller's environment) with everything Nix reads pointed at this installation."""
        unrelated = {key: value for key, value in inherited.items() if not key.startswith("NIX_")}
        return unrelated | {
            "NIX_CONF_DIR": str(self.root / "etc"),
            "NIX_USER_CONF_FILES": "",
            "NIX_CONFIG": "",
            "NIX_STORE_DIR": str(self.store_dir),
            "NIX_STATE_DIR": str(self.root / "var" / "nix"),
            "NIX_LOG_DIR": str(self.root / "var" / "log" / "nix"),
            "NIX_PATH": "",
            "HOME": str(self.root / "home"),
            "XDG_CACHE_HOME": str(self.root / "cache"),
            "XDG_CONFIG_HOME": str(self.root / "config"),
            "XDG_DATA_HOME": str(self.root / "data"),
        }


_private_nix: PrivateNix | None = None


def use_private_nix(root: Path) -> PrivateNix:
    """Create (or reuse) the private Nix under `root` and make every helper here run against it."""
    global _private_nix
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "home").mkdir(exist_ok=True)
    # The flake registry is a local empty one: Nix would otherwise fetch channels.nixos.org's.
    (root / "flake-registry.json").write_text(json.dumps({"flakes": [], "version": 2}))
    (root / "etc" / "nix.conf").write_text(PRIVATE_NIX_CONF.format(root=root))
    _private_nix = PrivateNix(root)
    return _private_nix


def private_nix() -> PrivateNix:
    if _private_nix is None:
        raise RuntimeError("nixeval.use_private_nix(root) was not called (tests/packaging/conftest.py does)")
    return _private_nix


def store_dir() -> Path:
    """The private Nix's store (where `builtins.storeDir` and every built path point)."""
    return private_nix().store_dir


def _run(argv: list[str], cwd: Path = REPO) -> str:
    environment = private_nix().environment(dict(os.environ))
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, env=environment, check=False)
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
          services = if ok then system.config.systemd.services else null;
          nginx = if ok then system.config.services.nginx else null;
          unitText = if ok then system.unitTexts.ninfer or null else null;
          firewall = system.config.networking.firewall.allowedTCPPorts;
          inherit (system.config) users;
        }}
        """
    )
