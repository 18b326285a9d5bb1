"""The suite's Nix helpers run on any machine with a `nix` binary: whatever the caller's Nix configuration says
(a fresh Debian nix-bin has none, so root builds want the missing `nixbld` group), they use their private Nix."""

from __future__ import annotations

from pathlib import Path

import pytest
from nixeval import build, eval_json, needs_nix, store_dir

pytestmark = needs_nix

HOST_SHELL_BUILD = """derivation {
  name = "private-nix-probe"; system = builtins.currentSystem; builder = "/bin/sh";
  args = [ "-c" "echo built offline > $out" ];
}"""

# What a machine may have set for its own Nix; each would break a build that inherited it.
HOSTILE_NIX_CONF = """build-users-group = nixbld-that-does-not-exist
sandbox = true
substituters = http://127.0.0.1:9/unreachable
"""


@pytest.fixture
def caller_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME without ~/.cache or ~/.config, as a new user has."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.mark.parametrize("configuration", ["empty", "hostile"])
def test_helpers_ignore_the_callers_nix_configuration(configuration, caller_home, tmp_path, monkeypatch):
    conf_dir = tmp_path / "etc-nix"
    conf_dir.mkdir()
    # "empty" is a fresh nix-bin: no /etc/nix/nix.conf, so Nix's compiled-in defaults (build users for root).
    if configuration == "hostile":
        (conf_dir / "nix.conf").write_text(HOSTILE_NIX_CONF)
        monkeypatch.setenv("NIX_CONFIG", HOSTILE_NIX_CONF)
        monkeypatch.setenv("NIX_REMOTE", "daemon")
        monkeypatch.setenv("NIX_STORE_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("NIX_CONF_DIR", str(conf_dir))
    monkeypatch.setenv("NIX_USER_CONF_FILES", str(conf_dir / "nix.conf"))

    output = build(HOST_SHELL_BUILD)

    assert output.parent == store_dir() and output.read_text() == "built offline\n"
    assert eval_json("builtins.storeDir") == str(store_dir())
    assert sorted(p.name for p in caller_home.iterdir()) == [], "the helpers wrote into the caller's HOME"
