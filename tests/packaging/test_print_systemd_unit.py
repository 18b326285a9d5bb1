"""`ninfer-serve --print-systemd-unit`: the plain-Linux unit is the one nix/unit.nix renders, and systemd accepts it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from nixeval import REPO, eval_json, needs_nix, needs_systemd_analyze

NINFER_SERVE = Path(sys.executable).parent / "ninfer-serve"

# (ninfer-serve arguments, the same options as mkUnit arguments besides `executable`); {tmp} is a test folder, where
# the web UI folder must exist (the server checks it)
CASES = {
    "defaults": ([], {}),
    "model-network-key": (
        ["/srv/models/q.ninfer", "--host", "0.0.0.0", "--port", "9000", "--api-key-file", "/etc/ninfer/keys",
         "--alias", '100% $HOME "q"'],
        {"model": "/srv/models/q.ninfer", "host": "0.0.0.0", "port": 9000, "apiKeyFile": "/etc/ninfer/keys",
         "extraFlags": ["--alias", '100% $HOME "q"']},
    ),
    "odd-values-and-engine-flags": (
        [
            "--config",
            "/srv/ninfer/router config.json",
            "--log-level",
            "debug",
            "--webui",
            "--webui-dir",
            "{tmp}/web ui",
            "--max-context",
            "8192",
            "--preserve-thinking",
        ],
        {
            "configFile": "/srv/ninfer/router config.json",
            "logLevel": "debug",
            "webui": True,
            "webuiDir": "{tmp}/web ui",
            # argparse order: the engine options in the order the parser declares them
            "extraFlags": ["--max-context", "8192", "--preserve-thinking"],
        },
    ),
    "a-longer-shutdown-grace": (["--shutdown-grace", "120"], {"shutdownGrace": 120}),
}


def case(name: str, tmp_path: Path) -> tuple[list[str], dict]:
    (tmp_path / "web ui").mkdir()
    (tmp_path / "web ui" / "index.html").write_text("<!doctype html>")
    arguments, nix_arguments = json.loads(json.dumps(CASES[name]).replace("{tmp}", str(tmp_path)))
    return arguments, nix_arguments


def printed_unit(arguments: list[str]) -> str:
    result = subprocess.run(
        [str(NINFER_SERVE), "--print-systemd-unit", *arguments],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def nix_unit(arguments: dict, tmp_path: Path) -> str:
    # Passed as JSON so that no value needs Nix string escaping.
    path = tmp_path / "arguments.json"
    path.write_text(json.dumps({"executable": str(NINFER_SERVE), **arguments}))
    return eval_json(f"((import ./nix/unit.nix).mkUnit (builtins.fromJSON (builtins.readFile {path}))).text")


def fields(unit_text: str) -> dict[str, dict[str, list[str]]]:
    """section -> key -> values in order (a repeated key is a list, as systemd reads it)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in unit_text.splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
        elif line and not line.startswith("#"):
            key, _, value = line.partition("=")
            current.setdefault(key, []).append(value)
    return sections


@needs_nix
@pytest.mark.parametrize("name", CASES)
def test_printed_unit_is_the_nix_unit(name, tmp_path):
    arguments, nix_arguments = case(name, tmp_path)
    printed = printed_unit(arguments)
    rendered = nix_unit(nix_arguments, tmp_path)
    assert fields(printed) == fields(rendered)
    assert printed == rendered


def test_the_stop_timeout_follows_the_shutdown_grace():
    # systemd's SIGKILL must come after the grace and the stream-end and connection waits that follow it.
    assert fields(printed_unit([]))["Service"]["TimeoutStopSec"] == ["60"]
    longer = fields(printed_unit(["--shutdown-grace", "120"]))["Service"]
    assert longer["TimeoutStopSec"] == ["150"]
    assert longer["ExecStart"][0].endswith("--log-level info --shutdown-grace 120")
    assert fields(printed_unit(["--shutdown-grace", "7.5"]))["Service"]["TimeoutStopSec"] == ["38"]


def test_printed_unit_reads_the_shared_hardening_table():
    # Negative control for the comparison above: the sandbox is the JSON table, not a copy of it.
    table = json.loads((REPO / "python/ninfer/systemd_hardening.json").read_text())["settings"]
    service = fields(printed_unit([]))["Service"]
    assert service["SystemCallFilter"] == table["SystemCallFilter"]
    assert service["MemoryDenyWriteExecute"] == ["true"]
    assert service["ExecStart"] == [f"{NINFER_SERVE} --host 127.0.0.1 --port 8080 --log-level info"]


@needs_systemd_analyze
@pytest.mark.parametrize("name", CASES)
def test_printed_unit_passes_systemd_analyze_verify(name, tmp_path):
    path = tmp_path / "ninfer.service"
    path.write_text(printed_unit(case(name, tmp_path)[0]))
    verified = subprocess.run(
        ["systemd-analyze", "verify", str(path)], check=False, capture_output=True, text=True, timeout=60
    )
    assert verified.stdout + verified.stderr == ""


def test_print_systemd_unit_refuses_what_the_server_refuses():
    result = subprocess.run(
        [str(NINFER_SERVE), "--print-systemd-unit", "--spec", "draft"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--spec draft: a separate draft model is not implemented yet" in result.stderr
