"""`ninfer-serve` itself: option validation through its `main` (refusals are one line, exit status 2, before any
model is loaded), and a real run as a subprocess with an API key file, checked with both SDKs' auth headers and
error shapes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import live_servers
import openai
import pytest
from ninfer.cli.serve import _check, _engine_options, _router_config, build_parser, main
from ninfer.errors import NinferError

STARTUP_TIMEOUT_S = 120.0
KEYS = ("first-key", "sk-second-2f9a")


def _serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ninfer.cli.serve", *args]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--spec", "draft"], "--spec draft: a separate draft model is not implemented yet"),
        (["--draft-tokens", "4"], "--draft-tokens needs --spec mtp"),
        (["--spec", "mtp", "--draft-tokens", "0"], "--draft-tokens must be in 1..5, got 0"),
        (["--spec", "mtp", "--draft-tokens", "6"], "--draft-tokens must be in 1..5, got 6"),
        (["--host-kv-mib", "512", "--prefix-cache", "off"], "--host-kv-mib / --host-state-slots keep prefix-cache"),
        (["--reserve-gib", "0"], "--reserve-gib:"),
        (["--device-state-slots", "2", "--max-concurrency", "4"],
         "--device-state-slots (2) must be 0 (auto) or at least --max-concurrency (4): one per lane"),
        (["--snapshot-interval", "100"], "--snapshot-interval must be a multiple of 64"),
        (["--host-state-slots", "4", "--prefix-cache", "off"], "--host-kv-mib / --host-state-slots keep prefix-cache"),
        (["--lm-head-draft", "8"], "--lm-head-draft:"),
        (["--max-concurrency", "9"], "--max-concurrency must be in 1..8"),
        (["--prefill-chunk", "100"], "--prefill-chunk must be a multiple of 64"),
        (
            ["--kv-capacity", "100", "--max-context", "4096"],
            "--kv-capacity (100) must hold at least one full context",
        ),
        (["--webui-dir", "/no/such/ui"], "--webui-dir /no/such/ui has no index.html"),
        (["--print-systemd-unit", "--webui"], "--webui in a service needs --webui-dir"),
        (["/no/such/model.ninfer"], "model file not found: /no/such/model.ninfer"),
    ],
)
def test_refused_options_are_one_line_errors(args, message, capsys):
    assert main(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"ninfer-serve: error: {message}")


@pytest.mark.parametrize(
    "args", [["--draft-tokens", "x"], ["--reserve-gib", "-1"], ["--port", "x"], ["--kv-dtype", "q3"],
             ["--kv-capacity", "most"], ["--kv-capacity", "0"]]
)
def test_invalid_values_are_one_line_usage_errors(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2
    assert line.startswith(f"ninfer-serve: error: argument {args[0]}") and line.endswith("(see ninfer-serve --help)")


def test_spec_options_reach_the_engine_options():
    """`--spec none` is no speculative decoding; `--spec mtp` drafts 3 per round unless --draft-tokens says."""
    for argv, expected in ((["--spec", "none"], ("none", 3)), (["--spec", "mtp"], ("mtp", 3)),
                           (["--spec", "mtp", "--draft-tokens", "5"], ("mtp", 5))):
        args = build_parser().parse_args(argv)
        _check(args)  # raises CliError for a refused option
        options = _engine_options(args)
        assert (options.spec, options.draft_tokens) == expected


def _config_of_two(tmp_path: Path, second: dict) -> Path:
    for name in ("a.ninfer", "b.ninfer"):
        (tmp_path / name).write_bytes(b"")  # the CLI checks that each path is a file; nothing is loaded here
    config = tmp_path / "models.json"
    config.write_text(json.dumps({"models": {"a": {"path": "a.ninfer"}, "b": {"path": "b.ninfer", **second}}}))
    return config


def test_alias_with_config_is_refused(tmp_path: Path, capsys):
    assert main(["--config", str(_config_of_two(tmp_path, {})), "--alias", "x"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == ("ninfer-serve: error: --alias names the one MODEL; with --config, give the model 'aliases' "
                    "in the config")


@pytest.mark.parametrize("flag, expected_a, expected_b", [([], None, False), (["--preserve-thinking"], True, False)])
def test_preserve_thinking_is_the_default_of_config_models(tmp_path: Path, flag, expected_a, expected_b):
    config_file = _config_of_two(tmp_path, {"preserve_thinking": False})
    config = _router_config(build_parser().parse_args(["--config", str(config_file), *flag]))
    assert [m.preserve_thinking for m in config.models] == [expected_a, expected_b]  # a model's own setting wins


def test_kv_capacity_auto_is_the_default_of_config_models(tmp_path: Path):
    config_file = _config_of_two(tmp_path, {"kv_capacity": 8192})
    config = _router_config(build_parser().parse_args(["--config", str(config_file), "--kv-capacity", "auto"]))
    assert [m.options.kv_capacity for m in config.models] == ["auto", 8192]


def test_a_wrong_engine_key_in_the_config_is_refused_before_serving(tmp_path: Path):
    # (main() turns this NinferError into its one-line error; calling it would serve forever where the check fails)
    config_file = _config_of_two(tmp_path, {"kv_dtype": "q3"})
    with pytest.raises(NinferError) as info:
        _router_config(build_parser().parse_args(["--config", str(config_file)]))
    assert str(info.value) == f'{config_file}: models.b.kv_dtype must be one of "bf16", "fp8", "int8", "nvfp4", "k8v4", "f32", got "q3"'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def keyed_server(pytestconfig, tiny_qwen3_5, tmp_path_factory) -> Iterator[str]:
    artifact = live_servers.artifact_for(pytestconfig, tiny_qwen3_5)
    key_file = tmp_path_factory.mktemp("keys") / "keys"
    key_file.write_text(f"# ninfer keys\n{KEYS[0]}\n\n{KEYS[1]}\n", encoding="utf-8")
    port = _free_port()
    process = subprocess.Popen(
        _serve_command(
            str(artifact),
            "--port",
            str(port),
            "--max-context",
            "256",
            "--max-concurrency",
            "1",
            "--threads",
            "1",
            "--api-key-file",
            str(key_file),
            "--log-level",
            "warning",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while True:
            assert process.poll() is None, f"ninfer-serve exited: {process.stderr.read()}"
            assert time.monotonic() < deadline, "ninfer-serve did not start"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_health_is_public_and_everything_else_needs_a_key(keyed_server):
    assert httpx.get(f"{keyed_server}/health").status_code == 200
    missing = httpx.get(f"{keyed_server}/v1/models")
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    wrong = httpx.get(f"{keyed_server}/v1/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "invalid API key"
    not_utf8 = httpx.get(f"{keyed_server}/v1/models", headers={"Authorization": b"Bearer \xff\xfe"})
    assert not_utf8.status_code == 401
    for key in KEYS:
        assert (
            httpx.get(f"{keyed_server}/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code
            == 200
        )
        assert httpx.get(f"{keyed_server}/v1/models", headers={"x-api-key": key}).status_code == 200
    assert httpx.get(f"{keyed_server}/metrics").status_code == 401


def test_sdks_authenticate_with_the_key_file(keyed_server):
    good = openai.OpenAI(base_url=f"{keyed_server}/v1", api_key=KEYS[0], max_retries=0)
    r = good.completions.create(model="m", prompt="Hi", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens == 2
    with pytest.raises(openai.AuthenticationError) as info:
        openai.OpenAI(base_url=f"{keyed_server}/v1", api_key="bad", max_retries=0).models.list()
    assert info.value.body["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError) as info:
        anthropic.Anthropic(base_url=keyed_server, api_key="bad", max_retries=0).messages.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
        )
    assert info.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid API key"},
    }


def test_key_file_errors_are_one_line(tmp_path: Path, capsys):
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n", encoding="utf-8")
    assert main(["--api-key-file", str(empty), "/no/model.ninfer"]) == 2
    assert capsys.readouterr().err.strip() == f"ninfer-serve: error: the API key file {empty} holds no key"
    assert main(["--api-key-file", str(tmp_path / "absent"), "/no/model.ninfer"]) == 2
    assert "cannot read the API key file" in capsys.readouterr().err
