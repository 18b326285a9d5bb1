"""The pipeline's Deltas as a sequence of typed output blocks: what Responses items and Anthropic content blocks
are both made of.

A generation's output is reasoning, then any mix of answer text and tool calls. Responses streams it as output items
(reasoning, message, function_call) and Anthropic as content blocks (thinking, text, tool_use); both open a block,
extend it, and close it before the next one opens. `OutputBlocks` does that bookkeeping once: feed it Deltas, and it
returns `BlockStart` / `BlockDelta` / `BlockStop` events, keeping each block's full text for the final object. A
protocol module only names and shapes the events.

The tool-call parser emits a call's name first and then its argument fragments, one call after another, so a call's
fragments always extend the block that is open.

Token logprobs (when the request asked for them) ride on the pipeline's first Delta after their tokens; each Delta
carries one kind of output, so they belong to the block that Delta extends (Responses shows a text block's logprobs on
its `output_text`). A Delta with logprobs and no text (tokens the stop-string matcher swallowed at the end) gives them
to the open block, in a BlockDelta with empty text; before any block opened there is nothing to give them to.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ninfer.serve.generation import Delta, TokenLogprob

REASONING = "reasoning"
TEXT = "text"
TOOL_CALL = "tool_call"


@dataclass
class Block:
    index: int  # position in the output, from 0
    kind: str  # reasoning | text | tool_call
    name: str | None = None  # the tool's name (tool_call only)
    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the tokens that wrote this block

    @property
    def text(self) -> str:
        """Reasoning text, answer text, or the call's arguments JSON text."""
        return "".join(self.parts)


@dataclass(frozen=True)
class BlockStart:
    block: Block


@dataclass(frozen=True)
class BlockDelta:
    block: Block
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class BlockStop:
    block: Block


BlockEvent = BlockStart | BlockDelta | BlockStop


class OutputBlocks:
    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self._open: Block | None = None

    def feed(self, delta: Delta) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        if delta.reasoning:
            self._extend(REASONING, None, delta.reasoning, events)
        if delta.content:
            self._extend(TEXT, None, delta.content, events)
        for call in delta.tool_calls:
            if call.name is not None:  # a new call: always a new block
                self._close(events)
                self._open_block(TOOL_CALL, call.name, events)
            if call.arguments:
                self._extend(TOOL_CALL, None, call.arguments, events)
        if delta.logprobs:
            self._attach(delta.logprobs, events)
        return events

    def finish(self) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        self._close(events)
        return events

    def _attach(self, logprobs: tuple[TokenLogprob, ...], events: list[BlockEvent]) -> None:
        """Gives a Delta's logprobs to the first block it extended, else to the open block (see the module doc)."""
        at = next((i for i, e in enumerate(events) if isinstance(e, BlockDelta)), None)
        if at is not None:
            delta = events[at] = replace(events[at], logprobs=logprobs)
        elif self._open is not None:
            delta = BlockDelta(self._open, "", logprobs)
            events.append(delta)
        else:
            return
        delta.block.logprobs.extend(logprobs)

    def _extend(self, kind: str, name: str | None, text: str, events: list[BlockEvent]) -> None:
        if self._open is None or self._open.kind != kind:
            self._close(events)
            self._open_block(kind, name, events)
        assert self._open is not None
        self._open.parts.append(text)
        events.append(BlockDelta(self._open, text))

    def _open_block(self, kind: str, name: str | None, events: list[BlockEvent]) -> None:
        self._open = Block(len(self.blocks), kind, name)
        self.blocks.append(self._open)
        events.append(BlockStart(self._open))

    def _close(self, events: list[BlockEvent]) -> None:
        if self._open is not None:
            events.append(BlockStop(self._open))
            self._open = None
