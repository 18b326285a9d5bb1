"""The rendered units, checked by systemd itself: `systemd-analyze verify` (empty output) and `security`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from nixeval import build, eval_json, needs_nix, needs_systemd_analyze, nixos_eval

pytestmark = [needs_nix, needs_systemd_analyze]

# Exposure score x10 that the unit must stay under (it measures 1.7 here; nix-offline.md's reference set 3.1).
SECURITY_THRESHOLD = 25

MODULE_CONFIGURATIONS = {
    "defaults": "enable = true;",
    "one-model-network": 'enable = true; model = "/var/lib/models/q.ninfer"; host = "0.0.0.0"; openFirewall = true;',
    "router-key-gpu-user": """enable = true; user = "llm"; group = "gpu"; gpu = 1; apiKeyFile = "/run/keys/ninfer";
        models.a = { path = "/m/a.ninfer"; engine.max_context = 8192; }; settings.ttl = 60;""",
    "webui-odd-flags": """enable = true; webui.enable = true; webui.directory = "/srv/web ui";
        extraFlags = [ "--kv-dtype" "fp8" "--note" "100% $HOME \\"quoted\\"" ];
        environment.EXTRA = "a%b \\"c\\"";""",
}


@pytest.fixture(scope="module")
def stub_package() -> Path:
    # The units' ExecStart must name an existing executable; this is the same store path the evaluations use.
    return build("import ./nix/tests/stub-nixpkgs/package.nix { }")


def verify(unit_text: str, directory: Path) -> tuple[str, int]:
    path = directory / "ninfer.service"
    path.write_text(unit_text)
    verified = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", f"--threshold={SECURITY_THRESHOLD}", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return verified.stderr + verified.stdout, security.returncode


@pytest.mark.parametrize("name", MODULE_CONFIGURATIONS)
def test_module_unit_passes_systemd_analyze(name, stub_package, tmp_path):
    result = nixos_eval(MODULE_CONFIGURATIONS[name])
    assert result["failedAssertions"] == []
    assert str(stub_package) in result["unitText"]
    output, security_status = verify(result["unitText"], tmp_path)
    assert output == ""
    assert security_status == 0


def test_plain_linux_unit_passes_systemd_analyze(tmp_path):
    text = eval_json(
        """((import ./nix/unit.nix).mkUnit {
             executable = "/bin/true"; apiKeyFile = "/etc/ninfer/keys"; gpu = 0; user = "ninfer";
           }).text"""
    )
    output, security_status = verify(text, tmp_path)
    assert output == ""
    assert security_status == 0


def test_verify_reports_what_the_tests_rely_on(stub_package, tmp_path):
    # Negative controls: systemd-analyze exits 0 on unknown keys and bad values, so the tests demand empty
    # output; a missing executable and a weaker sandbox must be caught too.
    good = nixos_eval("enable = true;")["unitText"]
    bad_value = good.replace("ProtectSystem=strict", "ProtectSystem=very")
    assert "Failed to parse protect system value" in verify(bad_value, tmp_path)[0]
    unknown_key = good.replace("[Service]\n", "[Service]\nProtectEverything=true\n")
    assert "Unknown key" in verify(unknown_key, tmp_path)[0]
    missing = good.replace(f"{stub_package}/bin/ninfer-serve", "/nonexistent/ninfer-serve")
    assert "/nonexistent/ninfer-serve" in verify(missing, tmp_path)[0]
    loose = "\n".join(
        line
        for line in good.splitlines()
        if not line.startswith(("Protect", "Private", "Restrict", "SystemCall", "Capability", "NoNew", "Dynamic"))
    )
    assert verify(loose, tmp_path)[1] != 0
