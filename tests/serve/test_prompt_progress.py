"""llama.cpp's `return_progress` on streamed chat completions: `prompt_progress` chunks while the prompt is read, as
llama-ui consumes them, on a live server whose model prefills in chunks of 64 tokens (so a long prompt gives
several reports). The tiny Qwen3.5 model writes noise (as reasoning, thinking being on): enough for the order."""

from __future__ import annotations

import json
import math

import httpx
import live_servers
import openai
import pytest

CHUNK = 64
# Long enough for several prefill chunks with the chat template around it.
LONG = [{"role": "user", "content": "Please summarize the following words. " + "lorem ipsum dolor sit amet " * 30}]


@pytest.fixture(scope="module")
def server(pytestconfig, tiny_qwen3_5):
    path = live_servers.artifact_for(pytestconfig, tiny_qwen3_5)
    config = {"models": {"tiny": {"path": str(path), "max_context": 1024, "prefill_chunk": CHUNK}}}
    with live_servers.serve_router(config) as live:
        yield live


def _sse_chunks(server, body: dict) -> list[dict]:
    chunks = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line.removeprefix("data: ")))
    return chunks


def _writes(chunk: dict) -> bool:
    delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
    return bool(delta.get("content") or delta.get("reasoning_content"))


def test_progress_chunks_precede_the_answer_one_per_prefill_chunk(server):
    chunks = _sse_chunks(server, {"model": "tiny", "messages": LONG, "max_tokens": 4, "temperature": 0,
                                  "stream": True, "return_progress": True,
                                  "stream_options": {"include_usage": True}})
    n_prompt = chunks[-1]["usage"]["prompt_tokens"]
    assert n_prompt > 2 * CHUNK
    reports = [i for i, c in enumerate(chunks) if "prompt_progress" in c]
    progress = [chunks[i]["prompt_progress"] for i in reports]
    assert len(progress) == math.ceil(n_prompt / CHUNK)
    assert [p["processed"] for p in progress] == [min((i + 1) * CHUNK, n_prompt) for i in range(len(progress))]
    assert all(p["total"] == n_prompt and p["cache"] == 0 for p in progress)
    times = [p["time_ms"] for p in progress]
    assert times == sorted(times) and times[0] > 0
    # Every report comes before the first written token, after the opening role chunk, in a chunk of the same
    # completion (id, model: llama-ui takes both from the first chunk that has them) that writes nothing.
    first_write = next(i for i, c in enumerate(chunks) if _writes(c))
    assert 0 < reports[0] and reports[-1] < first_write
    for i in reports:
        assert chunks[i]["id"] == chunks[0]["id"] and chunks[i]["model"] == "tiny"
        assert chunks[i]["object"] == "chat.completion.chunk"
        assert chunks[i]["choices"] == [{"index": 0, "delta": {}, "finish_reason": None, "logprobs": None}]


# Another long prompt: the other tests' LONG is in the prefix cache by now, and a prompt read from it needs fewer
# chunks.
FRESH = [{"role": "user", "content": "Please count the following words. " + "consectetur adipiscing elit sed do " * 40}]


def test_the_sdk_sees_progress_only_when_asked(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)

    def stream(**extra_body):
        chunks = list(client.chat.completions.create(model="tiny", messages=FRESH, max_tokens=3, temperature=0,
                                                     stream=True, extra_body=extra_body))
        return [(c.model_extra or {}).get("prompt_progress") for c in chunks], chunks

    asked, asked_chunks = stream(return_progress=True)
    plain, plain_chunks = stream()
    reports = [p for p in asked if p is not None]
    assert len(reports) >= 3 and reports[-1]["processed"] == reports[-1]["total"]
    assert all(p is None for p in plain)
    # The same answer either way: the progress chunks add nothing to the text or the finish.
    assert _sdk_text(asked_chunks) == _sdk_text(plain_chunks)
    assert asked_chunks[-1].choices[0].finish_reason == "length"


def _sdk_text(chunks) -> str:
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    return "".join((d.content or "") + ((d.model_extra or {}).get("reasoning_content") or "") for d in deltas)
