"""The project's chat templates render exactly the documented prompts (architecture reference, section 10.2)."""

from __future__ import annotations

import json

import pytest

from ninfer.errors import EngineError
from ninfer.frontend.templates import TEMPLATE_NAMES, load_chat_template, template_environment

QWEN = ("qwen3_5", "qwen3_6", "qwen3_8")
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & here",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def render(name: str, messages: list[dict], **kwargs) -> str:
    return template_environment().from_string(load_chat_template(name)).render(messages=messages, **kwargs)


def test_every_template_is_self_contained():
    for name in TEMPLATE_NAMES:
        assert "{% include" not in load_chat_template(name) and "{% extends" not in load_chat_template(name)


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_6"])
def test_thinking_on_by_default_and_off_on_request(name):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    base = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render(name, messages, add_generation_prompt=True) == base + "<think>\n"
    assert render(name, messages, add_generation_prompt=True, enable_thinking=False) == (
        base + "<think>\n\n</think>\n\n")
    assert render(name, messages) == base[: -len("<|im_start|>assistant\n")]


def test_qwen38_reasoning_effort():
    messages = [{"role": "user", "content": "Hi"}]
    tail = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    xhigh = "Reasoning effort is set to xhigh. Please think carefully and thoroughly before you answer."
    low = "Reasoning effort is set to low. Keep your thinking brief and get to the answer quickly."
    assert render("qwen3_8", messages, add_generation_prompt=True) == (
        f"<|im_start|>system\n{xhigh}<|im_end|>\n" + tail)
    assert render("qwen3_8", messages, add_generation_prompt=True, reasoning_effort="low") == (
        f"<|im_start|>system\n{low}<|im_end|>\n" + tail)
    assert render("qwen3_8", messages, add_generation_prompt=True, reasoning_effort="medium") == tail
    # No effort sentence when not thinking.
    assert render("qwen3_8", messages, add_generation_prompt=True, enable_thinking=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    with_system = [{"role": "system", "content": "Be brief."}, *messages]
    assert render("qwen3_8", with_system, add_generation_prompt=True, reasoning_effort="low").startswith(
        f"<|im_start|>system\n{low}\n\nBe brief.<|im_end|>\n")
    with pytest.raises(EngineError, match="reasoning_effort must be xhigh, medium or low"):
        render("qwen3_8", messages, reasoning_effort="max")


@pytest.mark.parametrize("name", QWEN)
def test_tools_catalogue_and_xml_calls_and_merged_responses(name):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "two calls",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                        {"type": "function", "function": {"name": "get_weather",
                                                          "arguments": {"city": "Oslo", "days": [1, 2]}}}]},
        {"role": "tool", "content": "18C"},
        {"role": "tool", "content": "9C"},
    ]
    text = render(name, messages, tools=[TOOL], add_generation_prompt=True, reasoning_effort="medium")
    catalogue = "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n" + json.dumps(
        TOOL) + "\n</tools>\n\n"
    assert text.startswith(catalogue)
    assert "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>" in text
    assert "</IMPORTANT>\n\nBe brief.<|im_end|>\n<|im_start|>user\nWeather in Paris and Oslo?<|im_end|>\n" in text
    assert text.endswith(
        "<|im_start|>assistant\n<think>\ntwo calls\n</think>\n\nChecking.\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
        "<parameter=days>\n[1, 2]\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\n9C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n")


def _history() -> list[dict]:
    return [
        {"role": "user", "content": "First?"},
        {"role": "assistant", "content": "One.", "reasoning_content": "thought one"},
        {"role": "user", "content": "Second?"},
        {"role": "assistant", "content": "Two.", "reasoning_content": "thought two"},
    ]


EARLIER_DROPPED = ("<|im_start|>user\nFirst?<|im_end|>\n<|im_start|>assistant\nOne.<|im_end|>\n"
                   "<|im_start|>user\nSecond?<|im_end|>\n"
                   "<|im_start|>assistant\n<think>\nthought two\n</think>\n\nTwo.<|im_end|>\n")
EARLIER_KEPT = ("<|im_start|>user\nFirst?<|im_end|>\n<|im_start|>assistant\n<think>\nthought one\n</think>\n\n"
                "One.<|im_end|>\n<|im_start|>user\nSecond?<|im_end|>\n"
                "<|im_start|>assistant\n<think>\nthought two\n</think>\n\nTwo.<|im_end|>\n")


def test_reasoning_of_earlier_turns_per_version():
    assert render("qwen3_5", _history()) == EARLIER_DROPPED
    assert render("qwen3_5", _history(), preserve_thinking=True) == EARLIER_DROPPED  # 3.5 has no such switch
    assert render("qwen3_6", _history()) == EARLIER_DROPPED  # default off
    assert render("qwen3_6", _history(), preserve_thinking=True) == EARLIER_KEPT
    assert render("qwen3_8", _history(), reasoning_effort="medium") == EARLIER_KEPT  # default on
    assert render("qwen3_8", _history(), reasoning_effort="medium", preserve_thinking=False) == EARLIER_DROPPED


def test_inline_reasoning_split_in_35_not_in_38():
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\nA"}]
    assert render("qwen3_5", messages) == (
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nA<|im_end|>\n")
    assert render("qwen3_8", messages, reasoning_effort="medium") == (
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<think>\nr\n</think>\n\nA"
        "<|im_end|>\n")


def test_tool_response_turn_is_not_the_last_query():
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "", "reasoning_content": "call it",
         "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
        {"role": "tool", "content": "R"},
        {"role": "assistant", "content": "Done.", "reasoning_content": "got it"},
    ]
    # Both assistant turns answer the same query, so both keep their reasoning even without preserve_thinking.
    assert render("qwen3_6", messages) == (
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\ncall it\n</think>\n\n"
        "<tool_call>\n<function=f>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nR\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\ngot it\n</think>\n\nDone.<|im_end|>\n")


def test_vision_placeholders():
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"},
                                              {"type": "video"}, {"type": "image"}]}]
    assert render("qwen3_5", messages, add_vision_id=True) == (
        "<|im_start|>user\nPicture 1: <|vision_start|><|image_pad|><|vision_end|>and"
        "Video 1: <|vision_start|><|video_pad|><|vision_end|>Picture 2: <|vision_start|><|image_pad|><|vision_end|>"
        "<|im_end|>\n")
    with pytest.raises(EngineError, match="System messages cannot contain images"):
        render("qwen3_5", [{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "x"}])


def test_qwen38_strict_message_rules():
    with pytest.raises(EngineError, match="System message must be at the beginning"):
        render("qwen3_8", [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])
    with pytest.raises(EngineError, match="No user query"):
        render("qwen3_8", [{"role": "system", "content": "b"}])
    assert render("qwen3_5", [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]) == (
        "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n")


def test_chatml():
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "U"}]}]
    assert render("chatml", messages, add_generation_prompt=True) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n")


def test_sandbox_refuses_unsafe_access():
    from jinja2.exceptions import SecurityError

    env = template_environment()
    with pytest.raises(SecurityError):
        env.from_string("{{ messages.__class__.__mro__ }}").render(messages=[])
