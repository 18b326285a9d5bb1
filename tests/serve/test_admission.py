"""Admission and cancellation on the live tiny-Qwen3.5 server (2 lanes, 16 queue places): many concurrent clients
get the answers they get alone, a full queue answers 429 with Retry-After, and a client that goes away frees its
lane (or queue place): its generation stops long before its end, and its lane is free within a second of the
server seeing the disconnect (by the server's own clock, /metrics), and of the client closing its socket."""

from __future__ import annotations

import asyncio
import contextlib
import time

import anthropic
import httpx
import openai
import pytest
from live_servers import (
    RELEASE_BOUND_S,
    cut_short,
    disconnect_releases,
    idle_tokens_generated,
    lanes_free_within,
    released_within_bound,
    wait_until,
)
from ninfer.engine import Request
from ninfer.serve.calls import Activity

LONG = 900  # tokens: longer than any test waits for (seconds of generation, even on an idle machine)


def _open_stream(client: httpx.Client, url: str, prompt: str) -> httpx.Response:
    request = client.build_request(
        "POST",
        f"{url}/v1/completions",
        json={"prompt": prompt, "max_tokens": LONG, "temperature": 0, "stream": True},
    )
    response = client.send(request, stream=True)
    assert response.status_code == 200, response.read()
    return response


def test_sixteen_clients_on_two_lanes_get_their_solo_answers(qwen35_server):
    prompts = [f"Client number {i} says" for i in range(16)]
    solo_client = openai.OpenAI(base_url=f"{qwen35_server.url}/v1", api_key="k", max_retries=0)
    alone = [
        solo_client.completions.create(model="m", prompt=p, temperature=0, max_tokens=8).choices[0].text
        for p in prompts
    ]

    async def together() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{qwen35_server.url}/v1", api_key="k", max_retries=0)
        async with client:
            answers = await asyncio.gather(
                *(
                    client.completions.create(model="m", prompt=p, temperature=0, max_tokens=8)
                    for p in prompts
                )
            )
        return [a.choices[0].text for a in answers]

    assert asyncio.run(together()) == alone
    assert lanes_free_within(qwen35_server)


def test_a_full_queue_answers_429_with_retry_after(qwen35_server):
    engine = qwen35_server.engine
    places = engine.options.max_concurrency + engine.options.max_queue
    tokens_before = idle_tokens_generated(qwen35_server)
    before = disconnect_releases(qwen35_server)
    with httpx.Client(timeout=30) as http, contextlib.ExitStack() as streams:
        for i in range(places):
            streams.callback(_open_stream(http, qwen35_server.url, f"Filler {i}").close)
        one_more = [{"role": "user", "content": "one more"}]
        client = openai.OpenAI(base_url=f"{qwen35_server.url}/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model="m", messages=one_more)
        assert int(refused.value.response.headers["retry-after"]) >= 1
        assert refused.value.body["type"] == "rate_limit_error"
        # /v1/messages answers the same refusal in Anthropic's error shape, which its SDK raises as its own type.
        claude = anthropic.Anthropic(base_url=qwen35_server.url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.RateLimitError) as refused_claude:
            claude.messages.create(model="m", max_tokens=8, messages=one_more)
        assert int(refused_claude.value.response.headers["retry-after"]) >= 1
        body = refused_claude.value.body
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        assert body["error"]["type"] == "rate_limit_error" and body["error"]["message"]
    # Closing the filler streams cancelled every one of them: run, even one of them would make LONG tokens.
    assert cut_short(qwen35_server, tokens_before, LONG)
    assert released_within_bound(qwen35_server, before, departures=places)


def test_a_disconnect_frees_the_lane(qwen35_server):
    engine = qwen35_server.engine
    tokens_before = idle_tokens_generated(qwen35_server)
    with httpx.Client(timeout=30) as http:
        response = _open_stream(http, qwen35_server.url, "Keep talking")
        lines = response.iter_lines()
        while '"text":""' in (line := next(lines)) or not line.startswith("data:"):
            pass  # until a frame with generated text: the request holds a lane
        assert engine.stats().busy_lanes == 1
        response.close()
    assert cut_short(qwen35_server, tokens_before, LONG)


def _lane_requests(server) -> list[str | None]:
    return [slot["request_id"] for slot in httpx.get(f"{server.url}/slots", timeout=30).json()]


def test_a_queued_request_that_disconnects_leaves_the_queue(qwen35_server):
    engine = qwen35_server.engine
    with httpx.Client(timeout=30) as http:
        holders = [
            _open_stream(http, qwen35_server.url, f"Holder {i}")
            for i in range(engine.options.max_concurrency)
        ]
        queued = _open_stream(http, qwen35_server.url, "Waiting")
        assert wait_until(lambda: engine.stats().queued == 1), engine.stats()
        holding = _lane_requests(qwen35_server)
        queued.close()
        assert wait_until(lambda: engine.stats().queued == 0), "the disconnected request is still queued"
        # It left the queue itself: the holders (LONG tokens each) still have both lanes, so it never got one.
        assert None not in holding and _lane_requests(qwen35_server) == holding
        for holder in holders:
            holder.close()
    assert lanes_free_within(qwen35_server)


NON_STREAMING = {  # route -> a non-streaming body that would generate LONG tokens
    "/v1/completions": {"prompt": "Take your time", "max_tokens": LONG, "temperature": 0},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Take your time"}], "max_tokens": LONG},
    "/v1/messages": {"messages": [{"role": "user", "content": "Take your time"}], "max_tokens": LONG},
    "/v1/responses": {"input": "Take your time", "max_output_tokens": LONG},
}


@pytest.mark.parametrize("route", NON_STREAMING)
def test_a_non_streaming_client_that_leaves_frees_its_lane(qwen35_server, route):
    tokens_before = idle_tokens_generated(qwen35_server)
    before = disconnect_releases(qwen35_server)
    with httpx.Client(timeout=httpx.Timeout(30, read=0.5)) as http:
        try:
            http.post(f"{qwen35_server.url}{route}", json={"model": "m", **NON_STREAMING[route]})
        except httpx.ReadTimeout:
            pass  # the client gave up and closes the connection
        else:
            raise AssertionError("the long generation answered within the read timeout")
    assert cut_short(qwen35_server, tokens_before, LONG)
    assert released_within_bound(qwen35_server, before)


def test_a_disconnect_frees_its_lane_within_a_second(qwen35_server):
    """Timed from the moment the client's socket is closed to the engine reporting no busy lane (polled every 2 ms).
    A tiny-model decode step takes milliseconds, so the bound measures the server's reaction, which is driven by
    events (the ASGI disconnect, then the engine's next step boundary), not by a poll or the next token: ~10 ms
    here even with the 2-core machine loaded 9 deep. The server's own clock (from seeing the disconnect to the lane
    being free) must agree."""
    engine = qwen35_server.engine
    with httpx.Client(timeout=30) as http:
        response = _open_stream(http, qwen35_server.url, "Keep talking")
        lines = response.iter_lines()
        while '"text":""' in (line := next(lines)) or not line.startswith("data:"):
            pass  # until a frame with generated text: the request is decoding in its lane
        before = disconnect_releases(qwen35_server)
        response.close()
        closed_at = time.monotonic()
        assert wait_until(lambda: engine.stats().busy_lanes == 0, pause=lambda: time.sleep(0.002))
        freed_s = time.monotonic() - closed_at
    assert freed_s < RELEASE_BOUND_S, f"the lane was freed {freed_s:.3f} s after the client closed its socket"
    assert released_within_bound(qwen35_server, before)


def test_slots_show_a_left_lane_busy_until_the_engine_frees_it(smollm2_server):
    """Issue 18, item 9: /slots counts the lanes as the engine does (the count /metrics and the KV figures follow),
    so a lane whose client left is shown busy until the engine frees it, never before. The client leaves while its
    long prompt is being read (SmolLM2's forward pass over ~1,800 tokens, which a cancel cannot cut
    short), so the engine
    holds the lane for a while after the server saw the client go. Each /slots answer is taken between two
    readings of the engine's count; the count only falls here (nothing else runs), so the busy lanes /slots shows
    lie between the two: at most the first, at least the second."""
    engine = smollm2_server.engine
    samples: list[tuple[int, int, int]] = []

    def sample() -> bool:
        before = engine.stats().busy_lanes
        shown = sum(slot["is_processing"] for slot in httpx.get(f"{smollm2_server.url}/slots", timeout=30).json())
        after = engine.stats().busy_lanes
        samples.append((before, shown, after))
        return before == shown == after == 0

    long_prompt = [{"role": "user", "content": "hello " * 1800}]
    with httpx.Client(timeout=30) as http:
        request = http.build_request("POST", f"{smollm2_server.url}/v1/chat/completions",
                                     json={"messages": long_prompt, "max_tokens": LONG, "stream": True})
        response = http.send(request, stream=True)
        assert response.status_code == 200, response.read()
        assert wait_until(lambda: engine.stats().busy_lanes == 1, pause=lambda: None)
        response.close()  # while the prompt is read
        assert wait_until(sample, pause=lambda: None), samples[-5:]
    assert any(shown == 1 for _, shown, _ in samples), "the lane was free before the first look"
    assert all(after <= shown <= before for before, shown, after in samples), [
        s for s in samples if not s[2] <= s[1] <= s[0]]


def test_an_activity_holds_its_lane_until_the_engines_final_event(qwen35_server):
    """The observer's side of the test above: a stream closed early (the client left) is done for control at once
    (its finish reason is `cancelled`), but it holds the engine until the cancel's final event arrives, which only
    comes at the engine's next step, after the close; by then the engine's count is free."""
    engine = qwen35_server.engine

    async def leave_early() -> tuple[bool, str | None, int]:
        activity = Activity(engine, n_prompt=3)
        stream = engine.submit(Request(prompt_tokens=[9419, 220, 846], max_new_tokens=LONG), observer=activity)
        await anext(stream)
        await stream.aclose()
        held_at_close = activity.holds_engine  # no await since the close: the final event cannot have been read
        while activity.holds_engine:
            await asyncio.sleep(0.001)
        return held_at_close, activity.finish_reason, engine.stats().busy_lanes

    held_at_close, reason, busy_after = asyncio.run(asyncio.wait_for(leave_early(), 30))
    assert held_at_close and reason == "cancelled" and busy_after == 0
