"""The frontend pipeline fed the way the server feeds it: the real Qwen3.5 tokenizer, text decoded token by token
(multi-byte characters split across tokens included), through reasoning split, stop strings and tool-call parsing.
The streamed result must equal the whole-text result, for the full generation and for every truncation of it."""

from functools import cache

import pytest
from ninfer.artifact.tokenizer_build import qwen35_tokenizer_json
from ninfer.frontend.reasoning import ReasoningParser, split_reasoning
from ninfer.frontend.stop_strings import StopStringMatcher, find_stop
from ninfer.frontend.tool_calls import ToolCallParser, ToolParseResult, parse_tool_calls
from tokenizers import Tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}

GENERATIONS = [
    (
        "用户想知道天气 🌦️.\nI should call the tool.\n</think>\n\nLet me check ☀️.\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nSão Paulo 東京\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    ),
    (
        'Short.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}'
        "\n</tool_call>"
    ),
    "Thinking <tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
    (
        'ok\n</think>\n\nRunning it.\n<function_calls>\n<invoke name="get_weather">\n<parameter name="city">Lima'
        "</parameter>\n</invoke>\n</function_calls>\nThe answer follows. END and more"
    ),
]
STOPS = ["END", "\n\n\n"]


@cache
def tokenizer() -> Tokenizer:
    return Tokenizer.from_str(qwen35_tokenizer_json())


def decoded_pieces(ids: list[int]) -> list[str]:
    """Incremental detokenisation: each token's new text, held while it ends in an incomplete UTF-8 sequence."""
    tok = tokenizer()
    pieces, emitted = [], ""
    for i in range(1, len(ids) + 1):
        text = tok.decode(ids[:i], skip_special_tokens=False)
        if text.endswith("\ufffd"):
            pieces.append("")
            continue
        pieces.append(text[len(emitted) :])
        emitted = text
    return pieces


def whole(text: str) -> tuple[str, ToolParseResult]:
    match = find_stop(text, STOPS)
    text = text if match is None else text[: match.start]
    split = split_reasoning(text, starts_in_reasoning=True)
    return split.reasoning, parse_tool_calls(split.content, [WEATHER])


def streamed(pieces: list[str]) -> tuple[str, ToolParseResult]:
    stops = StopStringMatcher(STOPS)
    reasoning = ReasoningParser(starts_in_reasoning=True)
    tools = ToolCallParser([WEATHER])
    thought: list[str] = []

    def pass_on(text: str) -> None:
        delta = reasoning.feed(text)
        thought.append(delta.reasoning)
        tools.feed(delta.content)

    for piece in pieces:
        fed = stops.feed(piece)
        pass_on(fed.text)
        if fed.stop is not None:
            break
    else:
        pass_on(stops.flush())
    end = reasoning.finish()
    thought.append(end.reasoning)
    tools.feed(end.content)
    tools.finish()
    return "".join(thought), tools.result()


@pytest.mark.parametrize("generation", GENERATIONS)
def test_token_stream_equals_whole_text_at_every_truncation(generation: str) -> None:
    ids = tokenizer().encode(generation, add_special_tokens=False).ids
    assert tokenizer().decode(ids, skip_special_tokens=False) == generation
    pieces = decoded_pieces(ids)
    assert "".join(pieces) == generation
    full = streamed(pieces)
    assert full == whole(generation)
    assert full[1].calls and full[1].calls[0].name == "get_weather"
    for n in range(len(ids)):
        assert streamed(pieces[:n]) == whole("".join(pieces[:n]))
