"""The pipeline's Deltas as a sequence of typed output blocks: what Responses items and Anthropic content blocks
are both made of.

A generation's output is reasoning, then any mix of answer text and tool calls. Responses streams it as output items
(reasoning, message, function_call) and Anthropic as content blocks (thinking, text, tool_use); both open a block,
extend it, and close it before the next one opens. `OutputBlocks` does that bookkeeping once: feed it Deltas, and it
returns `BlockStart` / `BlockDelta` / `BlockStop` events, keeping each block's full text for the final object. A
protocol module only names and shapes the events.

The tool-call parser emits a call's name first and then its argument fragments, one call after another, so a call's
fragments always extend the block that is open.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ninfer.serve.generation import Delta

REASONING = "reasoning"
TEXT = "text"
TOOL_CALL = "tool_call"


@dataclass
class Block:
    index: int  # position in the output, from 0
    kind: str  # reasoning | text | tool_call
    name: str | None = None  # the tool's name (tool_call only)
    parts: list[str] = field(default_factory=list)

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
        return events

    def finish(self) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        self._close(events)
        return events

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
