"""ninfer.serve.output_blocks (the block sequencing Responses items and Anthropic content blocks share), on
arbitrary Delta sequences: blocks open, extend and close in order, and nothing is lost or duplicated."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from ninfer.frontend.tool_calls import ToolCallDelta
from ninfer.serve.generation import Delta, TokenLogprob
from ninfer.serve.output_blocks import (
    REASONING,
    TEXT,
    TOOL_CALL,
    BlockDelta,
    BlockStart,
    BlockStop,
    OutputBlocks,
)

_text = st.text(max_size=6)


@st.composite
def delta_streams(draw) -> list[Delta]:
    """Deltas as the pipeline emits them: reasoning first, then content and tool calls in any mix; a call's name
    comes before its argument fragments, and calls are numbered in order."""
    deltas = [Delta(reasoning=r) for r in draw(st.lists(_text, max_size=4))]
    calls = 0
    call_open = False  # argument fragments follow their call's name until content (or another call) comes
    for kind in draw(st.lists(st.sampled_from(["content", "call", "args"]), max_size=12)):
        if kind == "content":
            deltas.append(Delta(content=draw(_text)))
            call_open = False
        elif kind == "call":
            deltas.append(
                Delta(tool_calls=(ToolCallDelta(calls, name=f"tool{calls}", arguments=draw(_text)),))
            )
            calls += 1
            call_open = True
        elif call_open:
            deltas.append(Delta(tool_calls=(ToolCallDelta(calls - 1, arguments=draw(_text)),)))
    return deltas


@given(delta_streams())
def test_blocks_are_well_nested_and_keep_every_piece(deltas):
    blocks = OutputBlocks()
    events = [event for delta in deltas for event in blocks.feed(delta)] + blocks.finish()

    open_block = None
    streamed: dict[int, str] = {}
    for event in events:
        if isinstance(event, BlockStart):
            assert open_block is None, "a block opened while another was open"
            open_block = event.block
            assert event.block.index == len(streamed)
            streamed[event.block.index] = ""
        elif isinstance(event, BlockDelta):
            assert open_block is event.block
            streamed[event.block.index] += event.text
        else:
            assert isinstance(event, BlockStop) and open_block is event.block
            open_block = None
    assert open_block is None
    assert streamed == {b.index: b.text for b in blocks.blocks}

    # Slow twin: the text of each kind, and the call names, straight from the deltas.
    assert "".join(b.text for b in blocks.blocks if b.kind == REASONING) == "".join(
        d.reasoning for d in deltas
    )
    assert "".join(b.text for b in blocks.blocks if b.kind == TEXT) == "".join(d.content for d in deltas)
    calls = [c for d in deltas for c in d.tool_calls]
    assert [b.name for b in blocks.blocks if b.kind == TOOL_CALL] == [c.name for c in calls if c.name]
    arguments: dict[int, str] = {}
    for call in calls:
        arguments[call.index] = arguments.get(call.index, "") + call.arguments
    assert [b.text for b in blocks.blocks if b.kind == TOOL_CALL] == [arguments[i] for i in sorted(arguments)]
    # Consecutive pieces of one kind share a block; a new kind (or a new call) starts one.
    kinds = [b.kind for b in blocks.blocks]
    assert all(a != b or a == TOOL_CALL for a, b in itertools.pairwise(kinds))


@given(delta_streams(), st.data())
def test_logprobs_go_to_the_block_their_delta_extends(deltas, data):
    """Each Delta's logprobs land, once and in order, on the block its text went to (a text-less one on the open
    block); every BlockDelta's logprobs are its block's, in order."""
    numbers = itertools.count()
    marked: list[Delta] = []
    for delta in deltas:
        if data.draw(st.booleans()):
            delta = replace(delta, logprobs=(TokenLogprob(str(next(numbers)), -1.0, []),))
        marked.append(delta)
        if data.draw(st.booleans()):  # tokens that wrote no text (a swallowed stop string)
            marked.append(Delta(logprobs=(TokenLogprob(str(next(numbers)), -1.0, []),)))
    blocks = OutputBlocks()
    expected: list[str] = []
    streamed: dict[int, list[TokenLogprob]] = {}
    for delta in marked:
        events = blocks.feed(delta)
        if blocks.blocks:  # before the first block there is nowhere to put them
            expected += [lp.token for lp in delta.logprobs]
        for event in events:
            if isinstance(event, BlockDelta):
                streamed.setdefault(event.block.index, []).extend(event.logprobs)
        kind = REASONING if delta.reasoning else TEXT if delta.content else None
        if kind is not None and delta.logprobs:
            (owner,) = [b for b in blocks.blocks if delta.logprobs[0] in b.logprobs]
            assert owner.kind == kind
    blocks.finish()
    assert [lp.token for b in blocks.blocks for lp in b.logprobs] == expected
    assert all(streamed.get(b.index, []) == b.logprobs for b in blocks.blocks)
