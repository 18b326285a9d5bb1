"""Ending a running generation's reasoning (ninfer.serve.reasoning_control and the `reasoning_end` control action)
on the real CPU engine with the tiny Qwen3.5 model, which thinks by default and, writing noise, never closes its
reasoning by itself: a `</think>` in its output is the forced one.

Greedy decoding, so every run is comparable with the same request run alone: up to the forced close the controlled
generation is the uncontrolled one; right after, `</think>`; then it keeps generating (its answer). Generations
running next to it, armed or not, are exactly what they are alone."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import jsonschema
import pytest
from ninfer.engine import Request, SamplingParams
from ninfer.frontend.reasoning import THINK_END, split_reasoning
from ninfer.serve.reasoning_control import ReasoningControl

HELLO = [{"role": "user", "content": "Hello, who are you?"}]
OTHER = [{"role": "user", "content": "Name three colours."}]
N_TOKENS = 24
END_AFTER = 5  # tokens seen before the end is asked for


def _greedy(prompt: list[int], constraint=None) -> Request:
    # No stop tokens: a random model may write end-of-sequence, and every run here must be N_TOKENS long.
    return Request(prompt, SamplingParams(temperature=0.0), max_new_tokens=N_TOKENS, stop_token_ids=(),
                   constraint=constraint)


async def _collect(engine, request: Request, on_token=None) -> list[int]:
    tokens: list[int] = []
    async for event in engine.generate(request):
        tokens.extend(event.token_ids)
        if on_token is not None:
            on_token(len(tokens))
    return tokens


def test_the_forced_close_comes_next_and_the_generation_goes_on(qwen35_server):
    engine = qwen35_server.engine
    frontend = engine.frontend
    rendered = frontend.render(HELLO)
    assert rendered.starts_in_reasoning
    prompt = frontend.encode(rendered.text)
    other_prompt = frontend.encode(frontend.render(OTHER).text)
    close = frontend.encode(THINK_END)

    async def scenario() -> tuple[list[int], list[int], list[int], list[int], ReasoningControl, list[bool]]:
        alone = await _collect(engine, _greedy(prompt))
        other_alone = await _collect(engine, _greedy(other_prompt))
        control = ReasoningControl(frontend, starts_in_reasoning=True)
        asked: list[bool] = []

        def end_once(n: int) -> None:
            if n >= END_AFTER and not asked:
                asked.append(control.end_reasoning())

        # The other request is armed too, and never asked: arming alone must change nothing.
        other_control = ReasoningControl(frontend, starts_in_reasoning=True)
        controlled, other = await asyncio.gather(
            _collect(engine, _greedy(prompt, control), end_once),
            _collect(engine, _greedy(other_prompt, other_control)))
        return alone, other_alone, controlled, other, control, asked

    alone, other_alone, controlled, other, control, asked = asyncio.run(scenario())
    assert close[0] not in alone, "the tiny model closed its reasoning by itself: the test would not mean anything"
    assert asked == [True]
    at = control.forced_at
    assert at is not None and at >= END_AFTER
    assert controlled[:at] == alone[:at]
    assert controlled[at:at + len(close)] == close
    assert len(controlled) == N_TOKENS > at + len(close), "the generation must go on after the close"
    split = split_reasoning(frontend.decode(controlled), starts_in_reasoning=True)
    assert split.reasoning_ended and split.reasoning == frontend.decode(alone[:at]).strip()
    assert other == other_alone
    assert control.end_reasoning() is True  # asked already: still granted, nothing more is forced


def test_nothing_to_end_when_the_reasoning_is_not_open(qwen35_server):
    engine = qwen35_server.engine
    frontend = engine.frontend
    rendered = frontend.render(HELLO, enable_thinking=False)
    assert not rendered.starts_in_reasoning
    prompt = frontend.encode(rendered.text)

    async def scenario() -> tuple[list[int], list[int], list[bool]]:
        alone = await _collect(engine, _greedy(prompt))
        control = ReasoningControl(frontend, starts_in_reasoning=False)
        asked: list[bool] = []
        tokens = await _collect(engine, _greedy(prompt, control),
                                lambda n: asked.append(control.end_reasoning()) if n == END_AFTER else None)
        return alone, tokens, asked

    alone, tokens, asked = asyncio.run(scenario())
    assert asked == [False]
    assert tokens == alone


# -- through the control route -------------------------------------------------------------------------------------


def _body(messages: list, max_tokens: int, **extra) -> dict:
    return {"model": "m", "messages": messages, "temperature": 0, "max_tokens": max_tokens, **extra}


def _stream(client: httpx.Client, body: dict, out: dict, reasoning_seen: threading.Event,
            content_seen: threading.Event | None = None) -> None:
    """Streams a chat request, noting its completion id once its reasoning is under way (and signalling when its
    answer starts)."""
    content, reasoning, finish = [], [], None
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                reasoning.append(choice["delta"].get("reasoning_content") or "")
                content.append(choice["delta"].get("content") or "")
                finish = choice["finish_reason"] or finish
            if any(reasoning) and not reasoning_seen.is_set():
                out["id"] = chunk["id"]
                reasoning_seen.set()
            if content_seen is not None and any(content):
                content_seen.set()
    out.update(reasoning="".join(reasoning), content="".join(content), finish=finish)
    reasoning_seen.set()


def _whole(client: httpx.Client, body: dict) -> dict:
    message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    return {"reasoning": message.get("reasoning_content") or "", "content": message["content"]}


def test_control_ends_the_reasoning_of_its_target_only(qwen35_server):
    client = httpx.Client(base_url=qwen35_server.url, timeout=300)
    # The target may run to the end of the context, so that it is still reasoning when the control arrives however
    # loaded the machine; it is stopped once its answer has started. The other one is short and is compared with
    # itself alone.
    target = _body(HELLO, 2000, reasoning_control=True)
    other = _body(OTHER, 40, reasoning_control=True)
    other_alone = _whole(client, other)
    out: dict = {"target": {}, "other": {}}
    reasoning_seen = {k: threading.Event() for k in out}
    answer_seen = threading.Event()
    threads = [threading.Thread(target=_stream, args=(client, target, out["target"], reasoning_seen["target"],
                                                      answer_seen)),
               threading.Thread(target=_stream, args=(client, other, out["other"], reasoning_seen["other"]))]
    for t in threads:
        t.start()
    assert reasoning_seen["target"].wait(120) and "id" in out["target"]
    target_id = out["target"]["id"]
    answer = client.post("/v1/chat/completions/control",
                         json={"id": target_id, "action": "reasoning_end", "model": "m"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"success": True, "id": target_id, "reasoning_ended": 1}
    assert answer_seen.wait(120), "the answer must follow the ended reasoning"
    stop = client.post("/v1/chat/completions/control", json={"id": target_id, "action": "stop"})
    for t in threads:
        t.join(300)
    assert stop.json()["cancelled"] == 1 and out["target"]["finish"] == "cancelled"
    assert out["target"]["reasoning"] and out["target"]["content"]
    assert {k: out["other"][k] for k in ("reasoning", "content")} == other_alone
    assert out["other"]["finish"] == "length"


def test_ending_the_reasoning_starts_the_structured_answer(qwen35_server):
    # The tiny model never closes its reasoning, so without the control this request would reason to the end of
    # the context and never write the value; once ended, the grammar takes over after the forced `</think>`.
    schema = {"type": "object", "properties": {"rank": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["rank"], "additionalProperties": False}
    body = _body(HELLO, 2000, reasoning_control=True,
                 response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}})
    client = httpx.Client(base_url=qwen35_server.url, timeout=300)
    out: dict = {}
    reasoning_seen = threading.Event()
    thread = threading.Thread(target=_stream, args=(client, body, out, reasoning_seen))
    thread.start()
    assert reasoning_seen.wait(120) and "id" in out
    answer = client.post("/v1/chat/completions/control", json={"id": out["id"], "action": "reasoning_end"})
    assert answer.json()["success"] is True
    thread.join(300)
    assert out["reasoning"] and out["finish"] == "stop"
    jsonschema.validate(json.loads(out["content"]), schema)


def test_control_refuses_to_end_what_was_not_armed(qwen35_server):
    client = httpx.Client(base_url=qwen35_server.url, timeout=300)
    out: dict = {}
    started = threading.Event()
    thread = threading.Thread(target=_stream, args=(client, _body(HELLO, 2000), out, started))
    thread.start()
    try:
        assert started.wait(120) and "id" in out
        answer = client.post("/v1/chat/completions/control", json={"id": out["id"], "action": "reasoning_end"})
        assert answer.status_code == 409 and "reasoning_control" in answer.json()["error"]["message"]
    finally:
        stop = client.post("/v1/chat/completions/control", json={"id": out.get("id", "?"), "action": "stop"})
        thread.join(300)
    assert stop.json()["cancelled"] == 1 and out["finish"] == "cancelled"


@pytest.mark.parametrize("action", ["reasoning_end", "end_reasoning"])
def test_unknown_generations_are_not_found(qwen35_server, action):
    client = httpx.Client(base_url=qwen35_server.url, timeout=60)
    answer = client.post("/v1/chat/completions/control", json={"id": "chatcmpl-none", "action": action})
    assert answer.status_code == 404


# -- the reasoning budget (llama-ui's thinking_budget_tokens) --------------------------------------------------------

BUDGET_MAX_TOKENS = 24


@pytest.mark.parametrize(("field", "budget"), [("thinking_budget_tokens", 6), ("reasoning_budget_tokens", 0)])
def test_a_reasoning_budget_ends_the_reasoning(qwen35_server, field, budget):
    client = httpx.Client(base_url=qwen35_server.url, timeout=300)
    close = qwen35_server.engine.frontend.encode(THINK_END)

    def ask(**extra) -> dict:
        return client.post("/v1/chat/completions", json=_body(HELLO, BUDGET_MAX_TOKENS, **extra)).json()

    # -1 is llama.cpp's "no budget": the tiny model then reasons to the end and never writes an answer.
    unlimited = ask(**{field: -1})
    assert unlimited["usage"]["completion_tokens_details"]["reasoning_tokens"] == BUDGET_MAX_TOKENS
    budgeted = ask(**{field: budget})
    used = budgeted["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert budget <= used <= budget + len(close), used  # the budget, then the forced close
    message = budgeted["choices"][0]["message"]
    assert message["content"], "the answer must follow the ended reasoning"
    # Up to the budget it is the same greedy reasoning.
    reasoning = message.get("reasoning_content") or ""
    assert unlimited["choices"][0]["message"]["reasoning_content"].startswith(reasoning)
    assert bool(reasoning) == (budget > 0)
