"""`make serve` as the README gives it: the Makefile prints the URL, then runs the environment's `ninfer-serve` entry
point with no MODEL, which serves the embedded default model (SmolLM2-135M-Instruct, imported into the cache). One
real server process covers both: the test reads the URL the Makefile printed and asks that exact URL, with the
official `openai` SDK, the question the `ninfer` CLI test asks.

The Makefile is run without its `build`/`venv` prerequisites (`-o`: the tests already run in the built environment)
and with VENV set to the running interpreter's environment, whose scripts folder must hold the `ninfer-serve` entry
point (`make build` installs it; a missing one fails the test). XDG_CACHE_HOME is the session's cache home that holds
the imported default model, so nothing is downloaded or converted here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import live_servers
import openai
import pytest
from ninfer.default_model import ARTIFACT_NAME

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 120.0  # a bound for a loaded 2-core machine, not a delay
STOP_TIMEOUT_S = 30.0
URL_LINE = re.compile(r"^ninfer-serve: starting on (http://\S+) \(OpenAI base URL (\S+)\)$", re.MULTILINE)
# make's own variables from an enclosing `make test` (jobserver, level) would change what this make prints and does.
MAKE_ENVIRONMENT = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEFILES", "MAKE_TERMOUT", "MAKE_TERMERR")


def _environment_root() -> Path:
    """The running interpreter's environment (what the Makefile calls VENV), checked to hold the entry point."""
    scripts = Path(sysconfig.get_path("scripts"))
    entry_point = scripts / "ninfer-serve"
    assert scripts.name == "bin" and entry_point.is_file(), (
        f"no ninfer-serve entry point in {scripts}: `make build` installs it into the environment the tests run in")
    return scripts.parent


@dataclass
class MadeServer:
    url: str  # as the Makefile printed it
    base_url: str  # the OpenAI base URL it printed
    log: Path  # make's and the server's output


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to make and the server it started (one process group), SIGKILL for anything still there after
    STOP_TIMEOUT_S; returns once the whole group is gone."""
    pgid = process.pid
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
    if not live_servers.wait_until(lambda: process.poll() is not None and not _group_alive(pgid), STOP_TIMEOUT_S):
        os.killpg(pgid, signal.SIGKILL)
    process.wait(timeout=STOP_TIMEOUT_S)
    assert live_servers.wait_until(lambda: not _group_alive(pgid), STOP_TIMEOUT_S), "make serve left processes behind"


@pytest.fixture(scope="module")
def made_server(smollm2_cache_home: Path, tmp_path_factory) -> Iterator[MadeServer]:
    port = live_servers.free_port()
    log = tmp_path_factory.mktemp("make-serve") / "output.log"
    env = {k: v for k, v in os.environ.items() if k not in MAKE_ENVIRONMENT}
    env["XDG_CACHE_HOME"] = str(smollm2_cache_home)
    command = ["make", "-o", "build", "-o", "venv", "serve", "HOST=127.0.0.1", f"PORT={port}",
               f"VENV={_environment_root()}", "ARGS=--max-concurrency 1 --max-context 1024 --log-level warning"]
    with open(log, "wb") as out:  # a file, not a pipe: nothing blocks if the output is not read
        process = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        live_servers.wait_until(lambda: URL_LINE.search(log.read_text()) is not None or process.poll() is not None,
                                STARTUP_TIMEOUT_S)
        printed = URL_LINE.search(log.read_text())
        assert printed, f"make serve printed no URL line:\n{log.read_text()}"
        server = MadeServer(printed[1], printed[2], log)

        def healthy() -> bool:
            assert process.poll() is None, f"make serve exited with {process.returncode}:\n{log.read_text()}"
            try:
                return httpx.get(f"{server.url}/health", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        assert live_servers.wait_until(healthy, STARTUP_TIMEOUT_S, lambda: time.sleep(0.2)), (
            f"{server.url}/health never answered:\n{log.read_text()}")
        yield server
    finally:
        _stop_group(process)


def test_make_serve_prints_the_url_it_serves(made_server: MadeServer):
    assert made_server.base_url == f"{made_server.url}/v1"
    assert made_server.url.startswith("http://127.0.0.1:")
    assert httpx.get(f"{made_server.url}/health").json() == {"status": "ok"}
    # The recipe ran the environment's entry point with no MODEL: only the printed options follow it.
    port = made_server.url.rsplit(":", 1)[1]
    recipe = f"{_environment_root()}/bin/ninfer-serve --host 127.0.0.1 --port {port} --max-concurrency 1"
    assert recipe in made_server.log.read_text()


def test_the_default_model_answers_the_capital_of_france(made_server: MadeServer):
    client = openai.OpenAI(base_url=made_server.base_url, api_key="unused", max_retries=0)
    default_id = ARTIFACT_NAME.removesuffix(".ninfer")
    assert [m.id for m in client.models.list().data] == [default_id]
    answer = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0,
        max_tokens=32)
    assert "Paris" in answer.choices[0].message.content
    assert answer.model == default_id
    loaded = httpx.get(f"{made_server.url}/v1/models").json()["data"][0]
    assert loaded["status"]["value"] == "loaded" and loaded["meta"]["n_ctx"] == 1024
