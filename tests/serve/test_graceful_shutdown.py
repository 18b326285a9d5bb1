"""SIGTERM ends streams properly (issue 18, item 4): `ninfer-serve` (a real process, the embedded default model)
with a 3 s grace; an OpenAI and an Anthropic stream, read by the official SDKs, that would run far longer. After
SIGTERM a new request is refused (503 / 529 with Retry-After) while the streams run; when the grace is over each
stream ends with its protocol's error event (and OpenAI's `[DONE]`), which the SDKs raise as an API error, not a
broken connection; the process then exits 0.

The refusals must be answered inside the grace (the process is gone soon after it), so the grace is several times a
refusal's round trip on a loaded 2-core machine, and the streams must outlast it at any machine's speed: a greedy
answer that runs to hundreds of tokens (not one the model ends early)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import anthropic
import httpx
import live_servers
import openai
import pytest

GRACE_S = 3.0


@pytest.fixture
def server(smollm2_cache_home):
    port = live_servers.free_port()
    env = {"XDG_CACHE_HOME": str(smollm2_cache_home), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen([sys.executable, "-m", "ninfer.cli.serve", "--port", str(port), "--shutdown-grace",
                                str(GRACE_S), "--log-level", "warning"], env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    assert live_servers.wait_until(lambda: _up(url), 120), process.stderr.read() if process.poll() else "no start"
    yield process, url
    if process.poll() is None:
        process.kill()
        process.wait()


def _health(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code
    except httpx.HTTPError:
        return None


def _up(url: str) -> bool:
    return _health(url) == 200


# Greedy, SmolLM2 writes this essay past 700 tokens (it was still writing at max_tokens=700: 55 s here); asked to
# count to 5000 it stopped after 121 tokens, which a fast machine generates inside the grace.
LONG = [{"role": "user", "content": "Write a very long essay, at least 5000 words, about the history of the Roman "
                                    "Empire."}]


def test_sigterm_refuses_new_requests_and_ends_streams_with_an_error(server):
    process, url = server
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    outcomes: dict[str, object] = {}
    started = threading.Barrier(3)

    def read(name: str, chunks_of, api_error: type[Exception]) -> None:
        """Reads one SDK stream, noting how it ended: completed, an API error (what the test wants), or broken."""
        chunks = 0
        try:
            for _ in chunks_of():
                chunks += 1
                if chunks == 2:
                    started.wait()
            outcomes[name] = ("completed", chunks)
        except api_error as exc:
            outcomes[name] = ("api error", chunks, str(exc))
        except Exception as exc:  # noqa: BLE001 - what the test must not see
            outcomes[name] = ("broken", chunks, repr(exc))

    def openai_chunks():
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        yield from client.chat.completions.create(model=model, messages=LONG, max_tokens=3000, stream=True,
                                                  temperature=0)

    def anthropic_chunks():
        client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
        # Greedy like the OpenAI stream: a sampled answer may stop counting (and end) inside the grace.
        with client.messages.stream(model=model, messages=LONG, max_tokens=3000,
                                     extra_body={"temperature": 0}) as stream:
            yield from stream.text_stream

    threads = [threading.Thread(target=read, args=("openai", openai_chunks, openai.APIError)),
               threading.Thread(target=read, args=("anthropic", anthropic_chunks, anthropic.APIError))]
    for thread in threads:
        thread.start()
    try:
        started.wait(timeout=120)
    except threading.BrokenBarrierError:
        pytest.fail(f"the streams did not start: {outcomes}")
    process.send_signal(signal.SIGTERM)
    # The drain has begun once /health is refused: a refusal sent earlier could be admitted as a new request.
    assert live_servers.wait_until(lambda: _health(url) == 503, GRACE_S), "SIGTERM did not start the drain"
    refused = httpx.post(f"{url}/v1/chat/completions", json={"messages": LONG, "max_tokens": 1}, timeout=10)
    refused_messages = httpx.post(f"{url}/v1/messages", json={"messages": LONG, "max_tokens": 1}, timeout=10)
    for thread in threads:
        thread.join(timeout=60)
    assert process.wait(timeout=30) == 0
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert refused.json()["error"]["code"] == "shutting_down"
    assert refused_messages.status_code == 529 and refused_messages.headers["retry-after"]
    assert refused_messages.json()["error"]["type"] == "overloaded_error"
    for name in ("openai", "anthropic"):
        outcome = outcomes[name]
        assert outcome[0] == "api error" and "shut down" in outcome[2], (name, outcome)
