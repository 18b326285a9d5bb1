"""Reasoning/content split: unit cases for the Qwen3.5 shapes, and streaming == whole text for any chunking."""

from hypothesis import given, settings
from hypothesis import strategies as st
from ninfer.frontend.reasoning import (
    THINK_END,
    THINK_START,
    TOOL_CALL_OPENERS,
    ReasoningDelta,
    ReasoningParser,
    ReasoningSplit,
    split_reasoning,
)
from test_frontend_chunks import chunkings, per_character

# Texts built from tag fragments, so tags, partial tags and near-misses are common.
FRAGMENTS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "<function_calls>",
    "\n",
    "\n\n",
    " ",
    "a",
    "b",
    "<",
    "</",
    "think",
    ">",
    "</thin",
    "<tool",
]
TAGGY_TEXT = st.lists(st.sampled_from(FRAGMENTS), max_size=25).map("".join)


def stream(pieces: list[str], *, starts_in_reasoning: bool) -> tuple[ReasoningSplit, list[ReasoningDelta]]:
    parser = ReasoningParser(starts_in_reasoning=starts_in_reasoning)
    deltas = [parser.feed(p) for p in pieces] + [parser.finish()]
    reasoning = "".join(d.reasoning for d in deltas)
    content = "".join(d.content for d in deltas)
    return ReasoningSplit(reasoning, content, parser.reasoning_ended), deltas


def test_thinking_on_generation_starts_inside_the_block() -> None:
    text = "The user wants 2+2.\nThat is 4.\n</think>\n\nThe answer is 4."
    expected = ReasoningSplit("The user wants 2+2.\nThat is 4.", "The answer is 4.", reasoning_ended=True)
    assert split_reasoning(text, starts_in_reasoning=True) == expected
    assert stream(per_character(text), starts_in_reasoning=True)[0] == expected


def test_thinking_off_is_all_content() -> None:
    text = "The answer is 4. Tags like </think> in content stay."
    assert split_reasoning(text, starts_in_reasoning=False) == ReasoningSplit("", text, reasoning_ended=False)


def test_model_opening_its_own_block() -> None:
    text = "\n<think>\nhmm\n</think>\nYes."
    assert split_reasoning(text, starts_in_reasoning=False) == ReasoningSplit(
        "hmm", "Yes.", reasoning_ended=True
    )
    # Only at the very start: later a <think> is content.
    assert (
        split_reasoning("Yes <think>x</think>", starts_in_reasoning=False).content == "Yes <think>x</think>"
    )


def test_cut_off_inside_reasoning_keeps_it_all_as_reasoning() -> None:
    text = "step one\nstep two </thi"
    assert split_reasoning(text, starts_in_reasoning=True) == ReasoningSplit(text, "", reasoning_ended=False)
    assert stream(per_character(text), starts_in_reasoning=True)[0].reasoning == text


def test_tool_call_inside_reasoning_reaches_content() -> None:
    text = "I should read it.\n<tool_call>\n<function=read>\n</function>\n</tool_call>"
    split = split_reasoning(text, starts_in_reasoning=True)
    assert split.reasoning == "I should read it."
    assert split.content == text[text.index("<tool_call>") :]
    assert stream(per_character(text), starts_in_reasoning=True)[0] == split


def test_partial_end_tag_is_held_not_leaked() -> None:
    parser = ReasoningParser(starts_in_reasoning=True)
    assert parser.feed("abc\n</th") == ReasoningDelta(reasoning="abc")
    assert parser.in_reasoning
    assert parser.feed("ink>\n\nHi") == ReasoningDelta(content="Hi")
    assert not parser.in_reasoning and parser.reasoning_ended


@settings(max_examples=400)
@given(st.data(), TAGGY_TEXT, st.booleans())
def test_stream_equals_whole_text_for_any_chunking(data: st.DataObject, text: str, starts: bool) -> None:
    pieces = data.draw(chunkings(text))
    assert stream(pieces, starts_in_reasoning=starts)[0] == split_reasoning(text, starts_in_reasoning=starts)


def assert_only_layout_and_tags_dropped(text: str, split: ReasoningSplit, starts: bool) -> None:
    """The split keeps every character but the two tags and the whitespace around the reasoning and at the start
    of the content, in place: text == [ws <think>] ws REASONING ws [</think> ws] CONTENT, and the block ends at the
    first end marker (`</think>`, or a tool-call opener, which stays in the content)."""
    if not starts and not text.lstrip().startswith(THINK_START):
        assert split == ReasoningSplit("", text, reasoning_ended=False)
        return
    rest = (text if starts else text.lstrip()[len(THINK_START) :]).lstrip()
    assert rest.startswith(split.reasoning)
    assert not any(marker in split.reasoning for marker in (THINK_END, *TOOL_CALL_OPENERS))
    rest = rest[len(split.reasoning) :].lstrip()
    if not split.reasoning_ended:
        assert (rest, split.content) == ("", "")
    elif rest.startswith(THINK_END):
        assert split.content == rest[len(THINK_END) :].lstrip()
    else:
        assert split.content == rest and rest.startswith(TOOL_CALL_OPENERS)


@settings(max_examples=300)
@given(st.one_of(TAGGY_TEXT, st.text()), st.booleans(), st.data())
def test_never_raises_and_loses_only_layout_and_the_two_tags(text: str, starts: bool, data: st.DataObject) -> None:
    split = split_reasoning(text, starts_in_reasoning=starts)
    assert_only_layout_and_tags_dropped(text, split, starts)
    assert stream(data.draw(chunkings(text)), starts_in_reasoning=starts)[0] == split
