"""Streams whose answer has a reasoning part and then a text part, through each protocol's official SDK: the
reasoning arrives first, then the text, as two blocks in the order and with the indices each SDK expects.

The tiny random Qwen3.5 model opens its reasoning (thinking is on) but never writes `</think>`. Two deterministic ways
to get both parts:
- SmolLM2, shown three answers of the form `<think>...</think>answer`, writes its own under greedy decoding (the
  reasoning split recognises a think block the output opens itself), and ends the turn by itself.
- Qwen3.5's reasoning is ended through the control route (`reasoning_control: true`, then `reasoning_end`), which
  forces `</think>` at the next token; the answer follows.
"""

from __future__ import annotations

import itertools

import anthropic
import httpx2 as httpx
import live_servers
import openai
import pytest
from ninfer.frontend.reasoning import split_reasoning

SHOWN = [("What is 2 + 2?", "Two plus two is four.", "4"), ("What is 3 + 5?", "Three plus five is eight.", "8"),
         ("What is 1 + 6?", "One plus six is seven.", "7")]
QUESTION = "What is 4 + 4?"
MAX_TOKENS = 48  # the answer ends well before


def _few_shot() -> list[dict]:
    messages: list[dict] = []
    for question, reasoning, answer in SHOWN:
        messages += [{"role": "user", "content": question},
                     {"role": "assistant", "content": f"<think>{reasoning}</think>{answer}"}]
    return [*messages, {"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def expected(smollm2_server) -> tuple[str, str]:
    """The reasoning and the answer of SmolLM2's own greedy output for the few-shot prompt."""
    _, text = live_servers.greedy_answer(smollm2_server, _few_shot(), MAX_TOKENS)
    split = split_reasoning(text, starts_in_reasoning=False)
    assert split.reasoning and split.content and split.reasoning_ended, f"SmolLM2 no longer copies the form: {text!r}"
    return split.reasoning, split.content


def _runs(kinds: list[str]) -> list[str]:
    """The kinds in order, consecutive repeats collapsed: ["reasoning", "text"] is one part after the other."""
    return [kind for kind, _ in itertools.groupby(kinds)]


def test_chat_stream_gives_reasoning_content_then_content(smollm2_server, expected):
    reasoning, answer = expected
    client = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", max_retries=0)
    kinds, parts, finish = [], {"reasoning": "", "text": ""}, None
    for chunk in client.chat.completions.create(model="m", messages=_few_shot(), max_tokens=MAX_TOKENS,
                                                temperature=0, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            delta_reasoning = (choice.delta.model_extra or {}).get("reasoning_content")
            if delta_reasoning:
                kinds.append("reasoning")
                parts["reasoning"] += delta_reasoning
            if choice.delta.content:
                kinds.append("text")
                parts["text"] += choice.delta.content
    assert _runs(kinds) == ["reasoning", "text"]
    assert parts == {"reasoning": reasoning, "text": answer} and finish == "stop"


def test_responses_stream_gives_a_reasoning_item_then_a_message_item(smollm2_server, expected):
    reasoning, answer = expected
    client = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", max_retries=0)
    # The SDK's stream helper rebuilds the response from the events, indexing its output by output_index: events out
    # of order, or at the wrong index, fail inside it.
    with client.responses.stream(model="m", input=_few_shot(), max_output_tokens=MAX_TOKENS, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    per_item = [
        "response.output_item.added", "response.content_part.added", "DELTA", "DONE", "response.content_part.done",
        "response.output_item.done",
    ]
    collapsed = [t for t, _ in itertools.groupby(e.type for e in events)]
    assert collapsed == [
        "response.created", "response.in_progress",
        *[{"DELTA": "response.reasoning_text.delta", "DONE": "response.reasoning_text.done"}.get(t, t)
          for t in per_item],
        *[{"DELTA": "response.output_text.delta", "DONE": "response.output_text.done"}.get(t, t) for t in per_item],
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    indexed = [e for e in events if hasattr(e, "output_index")]
    assert [e.output_index for e in indexed] == sorted(e.output_index for e in indexed)  # never goes back
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.type) for e in added] == [(0, "reasoning"), (1, "message")]
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert [item.id for item in final.output] == [e.item.id for e in added]
    assert final.output[0].content[0].text == reasoning and final.output_text == answer
    assert final.status == "completed"


def test_anthropic_stream_gives_a_thinking_block_then_a_text_block(smollm2_server, expected):
    reasoning, answer = expected
    client = anthropic.Anthropic(base_url=smollm2_server.url, api_key="unused", max_retries=0)
    body = {"model": "m", "max_tokens": MAX_TOKENS, "messages": _few_shot(), "extra_body": {"temperature": 0}}

    def final_message():
        with client.messages.stream(**body) as stream:  # the SDK's own accumulator
            return stream.get_final_message()

    events, final = live_servers.concurrently(lambda: list(client.messages.create(**body, stream=True)),
                                              final_message)
    collapsed = [t for t, _ in itertools.groupby(e.type for e in events)]
    assert collapsed == [
        "message_start",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]
    starts = [e for e in events if e.type == "content_block_start"]
    assert [(e.index, e.content_block.type) for e in starts] == [(0, "thinking"), (1, "text")]
    assert [e.index for e in events if e.type == "content_block_stop"] == [0, 1]
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert all((e.index, e.delta.type) in ((0, "thinking_delta"), (1, "text_delta")) for e in deltas)
    assert "".join(e.delta.thinking for e in deltas if e.index == 0) == reasoning
    assert "".join(e.delta.text for e in deltas if e.index == 1) == answer
    assert events[-2].delta.stop_reason == "end_turn"
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content] == [
        ("thinking", reasoning), ("text", answer)]


def test_qwen_chat_stream_after_its_reasoning_is_ended(qwen35_server):
    """Qwen3.5 with thinking on: reasoning deltas, the control route ends the reasoning, then content deltas, never
    mixed. The request is long (it must still be reasoning when the control arrives on a loaded machine) and is
    closed once the answer has started."""
    client = openai.OpenAI(base_url=f"{qwen35_server.url}/v1", api_key="unused", max_retries=0)
    kinds: list[str] = []
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hello"}], max_tokens=900, temperature=0, stream=True,
        extra_body={"reasoning_control": True})
    with stream:
        for chunk in stream:
            for choice in chunk.choices:
                if (choice.delta.model_extra or {}).get("reasoning_content"):
                    if not kinds:
                        answer = httpx.post(f"{qwen35_server.url}/v1/chat/completions/control",
                                            json={"id": chunk.id, "action": "reasoning_end"}, timeout=60)
                        assert answer.json()["reasoning_ended"] == 1, answer.text
                    kinds.append("reasoning")
                if choice.delta.content:
                    kinds.append("text")
            if "text" in kinds:
                break
    assert _runs(kinds) == ["reasoning", "text"]
    assert live_servers.lanes_free_within(qwen35_server)
