"""Chat rendering: template options, message normalisation, continuing a final assistant message, and the
project's own Qwen3.5-family / ChatML templates rendered through it (tool calls round-trip through the parser)."""

import json

import pytest
from ninfer.errors import EngineError
from ninfer.frontend.chat import ChatTemplate, flatten_content, prompt_opens_reasoning
from ninfer.frontend.templates import load_chat_template
from ninfer.frontend.tool_calls import parse_tool_calls

# A small ChatML template that shows which options it received.
PROBE = """
{%- for m in messages -%}
<|im_start|>{{ m.role }}
{{ m.content }}
{%- for c in m.tool_calls or [] %}[{{ c.function.name }}{% for k, v in c.function.arguments | items %} {{ k }}={{ v | tojson }}{% endfor %}]{% endfor %}<|im_end|>
{% endfor -%}
{%- if tools %}TOOLS {{ tools | tojson }}
{% endif -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% else %}<think>
{% endif %}{% endif -%}
opts: thinking={{ enable_thinking | default('undefined') }} preserve={{ preserve_thinking | default('undefined') }} effort={{ reasoning_effort | default('undefined') }} extra={{ extra | default('undefined') }}
"""

USER = {"role": "user", "content": "Hi <b>&"}


def probe() -> ChatTemplate:
    return ChatTemplate(PROBE)


def test_generation_prompt_and_options_passed_only_when_given() -> None:
    rendered = probe().render([USER])
    assert "<|im_start|>user\nHi <b>&<|im_end|>\n<|im_start|>assistant\n<think>\n" in rendered.text
    assert "thinking=undefined preserve=undefined effort=undefined extra=undefined" in rendered.text
    assert rendered.starts_in_reasoning and not rendered.continues_final_message
    off = probe().render(
        [USER],
        enable_thinking=False,
        preserve_thinking=True,
        reasoning_effort="low",
        chat_template_kwargs={"extra": 7},
    )
    assert "thinking=False preserve=True effort=low extra=7" in off.text
    assert not off.starts_in_reasoning


def test_tojson_does_not_html_escape() -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": "a <b> & 'c'"}}]
    assert "a <b> & 'c'" in probe().render([USER], tools=tools).text


def test_content_parts_are_flattened_and_media_refused_for_text_only_models() -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "input_text", "text": "two"}]
    assert "<|im_start|>user\none\ntwo<|im_end|>" in probe().render([{"role": "user", "content": parts}]).text
    with pytest.raises(EngineError, match="image_url"):
        probe().render([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    assert flatten_content(None, role="assistant") is None
    with pytest.raises(EngineError):
        flatten_content(42, role="user")


def test_tool_call_arguments_given_as_json_text_become_objects() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1, "b": "x"}'}}
    text = probe().render([USER, {"role": "assistant", "content": "", "tool_calls": [call]}]).text
    assert '[f a=1 b="x"]' in text


def test_final_text_assistant_message_is_continued() -> None:
    rendered = probe().render([USER, {"role": "assistant", "content": "The answer is"}])
    assert rendered.continues_final_message
    assert rendered.text.endswith("<|im_start|>assistant\nThe answer is")
    # Explicitly opening a new turn instead.
    new_turn = probe().render([USER, {"role": "assistant", "content": "Done."}], continue_final_message=False)
    assert new_turn.text.count("<|im_start|>assistant") == 2 and not new_turn.continues_final_message


def test_continuation_needs_a_text_only_assistant_message() -> None:
    with pytest.raises(EngineError, match="continue_final_message"):
        probe().render([USER], continue_final_message=True)
    call = {"function": {"name": "f", "arguments": "{}"}}
    rendered = probe().render([USER, {"role": "assistant", "content": "x", "tool_calls": [call]}])
    assert not rendered.continues_final_message


def test_template_errors_are_request_errors() -> None:
    with pytest.raises(EngineError, match="nope"):
        ChatTemplate("{{ raise_exception('nope') }}").render([USER])
    with pytest.raises(EngineError):
        ChatTemplate("{{ messages[0].content + 1 }}").render([USER])
    with pytest.raises(EngineError, match="does not compile"):
        ChatTemplate("{% for %}")
    with pytest.raises(EngineError, match="role"):
        probe().render([{"content": "no role"}])


def test_sandbox_blocks_attribute_escapes() -> None:
    with pytest.raises(EngineError):
        ChatTemplate("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}").render([USER])


def test_prompt_opens_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("plain")


# ---- the project's templates ---------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_6", "qwen3_8"])
def test_qwen_templates_thinking_on_and_off(name: str) -> None:
    template = ChatTemplate(load_chat_template(name))
    on = template.render([USER])
    assert on.text.endswith("<|im_start|>assistant\n<think>\n") and on.starts_in_reasoning
    off = template.render([USER], enable_thinking=False)
    assert off.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and not off.starts_in_reasoning


def test_qwen3_8_reasoning_effort_and_refusal() -> None:
    template = ChatTemplate(load_chat_template("qwen3_8"))
    assert "Reasoning effort is set to low" in template.render([USER], reasoning_effort="low").text
    with pytest.raises(EngineError, match="reasoning_effort"):
        template.render([USER], reasoning_effort="extreme")


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_6", "qwen3_8"])
def test_qwen_history_tool_call_round_trips_through_the_parser(name: str) -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "New York", "days": 3})},
    }
    messages = [
        USER,
        {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    prompt = ChatTemplate(load_chat_template(name)).render(messages, tools=[WEATHER]).text
    assert '"name": "get_weather"' in prompt and "<tool_response>\nsunny\n</tool_response>" in prompt
    turn = prompt.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    result = parse_tool_calls(turn, [WEATHER])
    assert [(c.name, json.loads(c.arguments)) for c in result.calls] == [
        ("get_weather", {"city": "New York", "days": 3})
    ]
    assert result.content.strip().endswith("Checking.") and result.issues == []


def test_qwen_continuation_of_a_partial_answer() -> None:
    template = ChatTemplate(load_chat_template("qwen3_5"))
    rendered = template.render([USER, {"role": "assistant", "content": "Hello! I am "}])
    assert rendered.continues_final_message and rendered.text.endswith("</think>\n\nHello! I am")
    assert not rendered.starts_in_reasoning


def test_chatml_template() -> None:
    rendered = ChatTemplate(load_chat_template("chatml")).render(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        ]
    )
    assert rendered.text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
