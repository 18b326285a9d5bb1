"""The flake, offline: its pin, the NixOS module from the flake, `nix flake check` against the stub nixpkgs."""

from __future__ import annotations

import json
import tomllib

import pytest
from nixeval import REPO, STUB_NIXPKGS, NixError, copy_flake, eval_json, needs_nix, nix, nixos_eval

pytestmark = needs_nix

PIN = {
    "owner": "NixOS",
    "repo": "nixpkgs",
    "type": "github",
    "rev": "c59305bab2065cfecc4944690d9eedbb56f3a9fa",
    "narHash": "sha256-69xHQhAeMAD2wDXO7T2pcOZIF9Sga2W+JkmY2a11Ops=",
    "lastModified": 1790822859,
}


@pytest.fixture
def flake(tmp_path):
    return copy_flake(tmp_path / "flake")


def flake_check_against_stub(flake_dir):
    return nix(
        ["flake", "check", "--no-write-lock-file", "--override-input", "nixpkgs", f"path:{STUB_NIXPKGS}"],
        cwd=flake_dir,
    )


def test_lock_pins_nixos_unstable(flake):
    lock = json.loads((REPO / "flake.lock").read_text())
    assert lock["nodes"]["nixpkgs"]["locked"] == PIN
    assert lock["nodes"]["nixpkgs"]["original"]["ref"] == "nixos-unstable"
    metadata = json.loads(nix(["flake", "metadata", "--json", "path:."], cwd=flake))
    assert metadata["locks"]["nodes"]["nixpkgs"]["locked"]["rev"] == PIN["rev"]


def test_nixos_module_from_the_flake_evaluates_without_nixpkgs(flake):
    # The flake's module defaults the package to the flake's own build (mkDefault); a user's package wins, and
    # the default is never evaluated, so this needs neither the network nor nixpkgs.
    result = eval_json(
        f"""let
              flake = builtins.getFlake "path:{flake}";
              stub = import ./nix/tests/stub-nixpkgs/package.nix {{ }};
              system = import ./nix/tests/stub-nixpkgs/nixos.nix {{
                modules = [ flake.nixosModules.default {{ services.ninfer = {{ enable = true; package = stub; }}; }} ];
              }};
            in {{ execStart = system.config.systemd.services.ninfer.serviceConfig.ExecStart; stub = "${{stub}}"; }}"""
    )
    assert result["execStart"].startswith(result["stub"] + "/bin/ninfer-serve ")


def test_flake_lib_renders_the_unit(flake):
    text = nix(
        ["eval", "--raw", "path:.#lib.mkUnit", "--apply", 'f: (f { executable = "/usr/bin/ninfer-serve"; }).text'],
        cwd=flake,
    )
    assert "ExecStart=/usr/bin/ninfer-serve --host 127.0.0.1 --port 8080 --log-level info\n" in text


def test_flake_lib_renders_the_nginx_config_the_module_uses(flake):
    # Plain systemd and containers take the same text as services.ninfer.gpus (see docs/deployment.md).
    text = nix(["eval", "--raw", "path:.#lib.mkNginxConfig", "--apply",
                'f: f { listen = "0.0.0.0:8080"; instances = [ "127.0.0.1:18080" "127.0.0.1:18081" ]; }'], cwd=flake)
    module = nixos_eval("enable = true; host = \"0.0.0.0\"; gpus = [ 0 1 ];")
    assert text == module["nginx"]["appendHttpConfig"]


def test_flake_check_passes_against_the_stub_nixpkgs(flake):
    # Evaluates every output for both systems and builds this system's checks, which run systemd-analyze verify
    # and security on the plain unit and on the module's unit.
    flake_check_against_stub(flake)


def test_flake_check_fails_when_the_unit_is_wrong(flake):
    # The sandbox table nix/unit.nix reads (shared with `ninfer-serve --print-systemd-unit`).
    table = flake / "python" / "ninfer" / "systemd_hardening.json"
    table.write_text(table.read_text().replace('"ProtectSystem": "strict"', '"ProtectSystem": "very"'))
    with pytest.raises(NixError, match="Failed to parse protect system value"):
        flake_check_against_stub(flake)


def test_flake_apps_run_the_server_entry_point_that_pyproject_declares(flake):
    # `nix run` starts `ninfer-serve`: the apps output names the package's bin/ninfer-serve, which pyproject declares.
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get("ninfer") == "ninfer.cli.main:main"
    assert scripts.get("ninfer-serve") == "ninfer.cli.serve:main"
    app = json.loads(nix(["eval", "--json", "--no-write-lock-file", "--override-input", "nixpkgs",
                          f"path:{STUB_NIXPKGS}", "path:.#apps.x86_64-linux.default"], cwd=flake))
    assert app["type"] == "app" and app["program"].endswith("/bin/ninfer-serve"), app


def test_pinned_llama_ui_lockfile_carries_resolved_and_integrity():
    """`make webui` checked the pinned llama-ui's lockfile (inside the sdist) and recorded it in the bundle."""
    from ninfer.serve.webui_bundle import bundle_dir

    if not (bundle_dir() / "index.html").is_file():
        pytest.skip(f"llama-ui is not built in {bundle_dir()} (make webui builds it)")
    record = bundle_dir() / "ninfer-lockfile.json"
    assert record.is_file(), f"make webui left a bundle without {record.name} in {bundle_dir()}"
    checked = json.loads(record.read_text())
    assert checked["unpinned"] == [] and checked["entries"] > 1000, checked


@pytest.mark.parametrize("lockfile", sorted(REPO.glob("webui/**/package-lock.json")) or [None])
def test_webui_lockfiles_carry_resolved_and_integrity(lockfile):
    if lockfile is None:
        pytest.skip("webui/ has no lockfile of its own (the dashboard uses no npm packages)")
    packages = json.loads(lockfile.read_text())["packages"]
    missing = [
        name
        for name, entry in packages.items()
        if name and not entry.get("link") and not ("resolved" in entry and "integrity" in entry)
    ]
    assert missing == [], f"{lockfile}: entries without resolved/integrity (Nix's importNpmLock needs both)"
