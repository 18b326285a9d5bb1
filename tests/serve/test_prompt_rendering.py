"""What the server renders for a conversation, seen through its own routes: `--preserve-thinking` (as `ninfer-serve
MODEL --preserve-thinking` configures it) keeps earlier turns' reasoning, and a final text-only assistant message is
continued rather than answered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx2 as httpx
import live_servers
import openai
import pytest
from ninfer.artifact.convert import convert
from ninfer.cli.serve import _router_config, build_parser

EARLIER_REASONING = "The user greets me; greet back warmly."
HISTORY = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?", "reasoning_content": EARLIER_REASONING},
    {"role": "user", "content": "Tell me a joke"},
]


@pytest.fixture(scope="module")
def qwen36_artifact(pytestconfig, tiny_qwen3_5) -> Path:
    """The tiny Qwen3.5 checkpoint with the Qwen3.6 chat template, which honours preserve_thinking (the Qwen3.5 one
    always drops earlier reasoning, so the flag could not show there)."""
    out = Path(pytestconfig.cache.mkdir("runtime-artifacts")) / f"{tiny_qwen3_5.name}.qwen3_6.bf16.ninfer"
    if not out.exists():
        convert(tiny_qwen3_5, out, recipe="bf16", template="qwen3_6", progress=False)
    return out


@pytest.fixture(scope="module")
def cli_servers(qwen36_artifact) -> Iterator[dict[str, str]]:
    """The one MODEL served as ninfer-serve's arguments configure it, with and without --preserve-thinking: URLs."""
    argv = [str(qwen36_artifact), "--max-context", "512", "--max-concurrency", "1"]
    with live_servers.serve_parsed_config(_router_config(build_parser().parse_args([*argv, "--preserve-thinking"]))
                                          ) as keeping, \
            live_servers.serve_parsed_config(_router_config(build_parser().parse_args(argv))) as dropping:
        yield {"keeping": keeping.url, "dropping": dropping.url}


def _rendered(url: str) -> tuple[str, int]:
    """The prompt /apply-template shows, and the prompt tokens chat counts for the same messages."""
    prompt = httpx.post(f"{url}/apply-template", json={"messages": HISTORY}, timeout=120).json()["prompt"]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    usage = client.chat.completions.create(model="m", messages=HISTORY, max_tokens=1, temperature=0).usage
    assert usage.prompt_tokens == len(httpx.post(f"{url}/tokenize", json={"content": prompt}).json()["tokens"])
    return prompt, usage.prompt_tokens


def test_preserve_thinking_keeps_earlier_reasoning_in_the_prompt(cli_servers):
    kept, kept_tokens = _rendered(cli_servers["keeping"])
    dropped, dropped_tokens = _rendered(cli_servers["dropping"])
    assert f"<think>\n{EARLIER_REASONING}\n</think>" in kept
    assert EARLIER_REASONING not in dropped
    assert kept_tokens > dropped_tokens


CONTINUED = [{"role": "user", "content": "Finish my sentence."},
             {"role": "assistant", "content": "The capital of France is"}]


def test_a_final_text_only_assistant_message_is_continued(qwen35_server):
    """The prompt ends with the message's own text (no end of turn, no new assistant turn), and the answer is the
    engine's greedy continuation of exactly that prompt; `continue_final_message: false` opens a new turn instead."""
    url = qwen35_server.url
    prompt = httpx.post(f"{url}/apply-template", json={"messages": CONTINUED}).json()["prompt"]
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nThe capital of France is")
    assert prompt.count("<|im_start|>assistant") == 1
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    continued, new_turn = live_servers.concurrently(
        lambda: client.chat.completions.create(model="m", messages=CONTINUED, max_tokens=8, temperature=0),
        lambda: client.chat.completions.create(model="m", messages=CONTINUED, max_tokens=8, temperature=0,
                                               extra_body={"continue_final_message": False}),
    )
    engine = qwen35_server.engine
    prompt_ids = engine.frontend.encode(prompt)
    assert continued.usage.prompt_tokens == len(prompt_ids)
    assert continued.choices[0].message.content == engine.frontend.decode(
        live_servers.greedy_tokens(engine, prompt_ids, 8))
    assert "reasoning_content" not in (continued.choices[0].message.model_extra or {})  # inside a closed think block
    # A new turn: the template closes the message and opens another assistant turn (thinking, by default).
    assert new_turn.usage.prompt_tokens > continued.usage.prompt_tokens
    assert new_turn.usage.completion_tokens_details.reasoning_tokens == 8


def test_reasoning_effort_other_than_none_reaches_the_template(qwen35_server, monkeypatch):
    """An effort other than "none" (chat `reasoning_effort`, Responses `reasoning.effort`, Anthropic
    `output_config.effort`) is given to the chat template as its `reasoning_effort` variable (seen here at the model's
    template) and does not touch thinking. The Qwen3.5 template has no use for it (the Qwen3.8 one writes an effort
    sentence: tests/test_templates.py), so the prompt is the default one, thinking on, where "none" turns it off."""
    template = qwen35_server.engine.frontend.chat_template
    render = template.render
    given: list[tuple[str | None, bool | None]] = []

    def recording_render(messages, **options):
        given.append((options.get("reasoning_effort"), options.get("enable_thinking")))
        return render(messages, **options)

    monkeypatch.setattr(template, "render", recording_render)
    url = qwen35_server.url
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    chat = client.chat.completions.create(model="m", messages=CONTINUED[:1], max_tokens=2, temperature=0,
                                          reasoning_effort="low")
    response = client.responses.create(model="m", input=CONTINUED[:1], max_output_tokens=2, temperature=0,
                                       reasoning={"effort": "medium"})
    message = claude.messages.create(model="m", max_tokens=2, messages=CONTINUED[:1],
                                     extra_body={"temperature": 0, "output_config": {"effort": "high"}})
    assert given == [("low", None), ("medium", None), ("high", None)]
    monkeypatch.undo()
    default = httpx.post(f"{url}/apply-template", json={"messages": CONTINUED[:1]}).json()["prompt"]
    assert default.endswith("<|im_start|>assistant\n<think>\n")  # thinking on: the think block is left open
    n_default = len(qwen35_server.engine.frontend.encode(default))
    assert chat.usage.prompt_tokens == response.usage.input_tokens == message.usage.input_tokens == n_default
    assert chat.usage.completion_tokens_details.reasoning_tokens == 2
    assert [item.type for item in response.output] == ["reasoning"] and message.content[0].type == "thinking"
