"""`services.ninfer.gpus`: one ninfer-serve per GPU behind nginx. The module's rendered nginx config is checked by
Debian's nginx (`nginx -t`), then run on loopback in front of real ninfer-serve processes (CPU, the tiny Qwen3.5
checkpoint) at the ports the module gave the instances: each conversation (X-Conversation-Id) sticks to one
instance, and stopping one instance moves its conversations and no others."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from live_servers import artifact_for, free_port
from nixeval import REPO, eval_json, needs_nix, nixos_eval

NGINX = shutil.which("nginx", path=os.environ.get("PATH", "") + os.pathsep + "/usr/sbin")
pytestmark = [
    needs_nix,
    pytest.mark.skipif(NGINX is None, reason="nginx is not installed (CI: `apt-get install -y nginx`)"),
]

# The routing the test reads back: nginx's own record of which instance answered each conversation's request.
ROUTE_LOG_FORMAT = "log_format route '$http_x_conversation_id $upstream_addr $status';"
CONVERSATIONS = [f"conversation-{i}" for i in range(30)]
STARTUP_TIMEOUT_S = 90.0


def fleet(gpus: list[int], port: int, instance_base_port: int) -> dict:
    body = f"enable = true; gpus = [ {' '.join(map(str, gpus))} ]; port = {port}; instanceBasePort = {instance_base_port};"
    result = nixos_eval(body)
    assert result["failedAssertions"] == []
    return result


def write_nginx_conf(http_config: str, directory: Path) -> Path:
    """A whole nginx.conf around the module's http-context text, with every file nginx writes under `directory`."""
    (directory / "ninfer.conf").write_text(http_config)
    conf = directory / "nginx.conf"
    conf.write_text(f"""
daemon off;
pid {directory}/nginx.pid;
error_log {directory}/error.log warn;
events {{ worker_connections 256; }}
http {{
    {ROUTE_LOG_FORMAT}
    access_log {directory}/access.log route;
    client_body_temp_path {directory}/client_body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    include {directory}/ninfer.conf;
}}
""")
    return conf


def nginx_test(conf: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([NGINX, "-t", "-c", str(conf), "-p", str(conf.parent), "-e", str(conf.parent / "error.log")],
                          capture_output=True, text=True, timeout=30, check=False)


def test_rendered_nginx_config_passes_nginx_t(tmp_path):
    result = fleet([0, 1, 2, 3], 8080, 18080)
    services = result["services"]
    assert sorted(services) == ["ninfer-gpu0", "ninfer-gpu1", "ninfer-gpu2", "ninfer-gpu3"]
    for position, gpu in enumerate([0, 1, 2, 3]):
        service = services[f"ninfer-gpu{gpu}"]
        assert service["environment"]["CUDA_VISIBLE_DEVICES"] == str(gpu)
        assert service["environment"]["HOME"] == f"/var/lib/ninfer-gpu{gpu}"
        assert service["serviceConfig"]["StateDirectory"] == f"ninfer-gpu{gpu}"
        assert service["serviceConfig"]["CacheDirectory"] == f"ninfer-gpu{gpu}"
        assert f"--host 127.0.0.1 --port {18080 + position} " in service["serviceConfig"]["ExecStart"]
    http_config = result["nginx"]["appendHttpConfig"]
    assert result["nginx"]["enable"] is True
    assert re.findall(r"server (\S+) max_fails", http_config) == [f"127.0.0.1:{p}" for p in range(18080, 18084)]

    checked = nginx_test(write_nginx_conf(http_config, tmp_path))
    assert checked.returncode == 0 and "syntax is ok" in checked.stderr, checked.stderr
    # nginx really read the module's text: a broken directive in it fails the check.
    broken = nginx_test(write_nginx_conf(http_config.replace("consistent;", "consistently;"), tmp_path))
    assert broken.returncode != 0 and "consistently" in broken.stderr, broken.stderr


@pytest.mark.parametrize(("body", "message"), [
    ("gpus = [ 0 1 ]; gpu = 0;", "set either `gpu`"),
    ("gpus = [ 1 1 ];", "lists a GPU twice"),
    ("gpus = [ 0 1 ]; instanceBasePort = 8079;", "is nginx's `port`"),
])
def test_fleet_assertions(body, message):
    failed = nixos_eval("enable = true; " + body)["failedAssertions"]
    assert len(failed) == 1 and message in failed[0], failed


def consecutive_free_ports(count: int) -> int:
    for _ in range(100):
        base = free_port()
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + count):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise RuntimeError(f"no {count} consecutive free loopback ports")


def wait_until_up(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: ninfer-serve exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url}: ninfer-serve did not come up")


@contextlib.contextmanager
def running(argv: list[str], log: Path) -> Iterator[subprocess.Popen]:
    with log.open("w") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def routes(access_log: Path) -> dict[str, set[str]]:
    """Conversation -> the instances that answered it (the last address nginx tried for each request)."""
    answered: dict[str, set[str]] = {}
    for line in access_log.read_text().splitlines():
        conversation, *addresses, status = line.replace(",", " ").split()
        assert status == "200", line
        answered.setdefault(conversation, set()).add(addresses[-1])
    return answered


def chat_every_conversation(client: openai.OpenAI, turns: int) -> None:
    for _ in range(turns):
        for conversation in CONVERSATIONS:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                           extra_headers={"X-Conversation-Id": conversation})


def test_conversations_stick_and_only_a_lost_instance_moves(pytestconfig, tiny_qwen3_5, tmp_path):
    artifact = artifact_for(pytestconfig, tiny_qwen3_5)
    nginx_port, base = free_port(), consecutive_free_ports(3)
    result = fleet([0, 1, 2], nginx_port, base)
    instance_ports = {name: int(re.search(r"--port (\d+)", s["serviceConfig"]["ExecStart"]).group(1))
                      for name, s in result["services"].items()}
    serve = str(Path(sys.executable).parent / "ninfer-serve")
    conf = write_nginx_conf(result["nginx"]["appendHttpConfig"], tmp_path)
    with contextlib.ExitStack() as stack:
        instances = {name: stack.enter_context(running(
            [serve, str(artifact), "--alias", "tiny", "--host", "127.0.0.1", "--port", str(port), "--max-context", "256",
             "--max-concurrency", "1", "--threads", "1"], tmp_path / f"{name}.log"))
            for name, port in instance_ports.items()}
        for name, process in instances.items():
            wait_until_up(f"http://127.0.0.1:{instance_ports[name]}", process)
        nginx = stack.enter_context(running([NGINX, "-c", str(conf), "-p", str(tmp_path), "-e",
                                             str(tmp_path / "error.log")], tmp_path / "nginx.log"))
        wait_until_up(f"http://127.0.0.1:{nginx_port}", nginx)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{nginx_port}/v1", api_key="unused", max_retries=0)
        access_log = tmp_path / "access.log"
        access_log.write_text("")  # drop the health probe's line

        chat_every_conversation(client, turns=2)
        before = routes(access_log)
        assert sorted(before) == sorted(CONVERSATIONS)
        assert all(len(answered) == 1 for answered in before.values()), before
        placement = {conversation: answered.pop() for conversation, answered in before.items()}
        assert set(placement.values()) == {f"127.0.0.1:{port}" for port in instance_ports.values()}, placement

        lost = "ninfer-gpu1"
        lost_address = f"127.0.0.1:{instance_ports[lost]}"
        instances[lost].terminate()
        instances[lost].wait(timeout=30)
        access_log.write_text("")
        chat_every_conversation(client, turns=2)
        after = routes(access_log)

    for conversation, address in placement.items():
        answered = after[conversation]
        if address == lost_address:
            # nginx first tries the stopped instance (refused), then the conversation's next one on the ring.
            assert lost_address not in answered and len(answered) == 1, (conversation, answered)
        else:
            assert answered == {address}, (conversation, address, answered)


def test_deployment_docs_template_is_what_the_module_renders():
    docs = (REPO / "docs" / "deployment.md").read_text()
    template = re.search(r"from this template \(what `lib.mkNginxConfig` renders\):\n\n```nginx\n(.*?)```", docs,
                         re.DOTALL).group(1)
    rendered = eval_json('(import ./nix/nginx.nix).mkNginxConfig { listen = "0.0.0.0:8080"; '
                         'instances = [ "127.0.0.1:18080" "127.0.0.1:18081" ]; }')

    def directives(text: str) -> list[str]:
        return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]

    assert directives(template) == directives(rendered)
