"""Split `<think>...</think>` reasoning from the answer, for a whole text or a token stream.

Qwen3.5 chat templates end the generation prompt inside an open think block (`<think>\\n`) when thinking is on, so the
generation starts as reasoning and `</think>` switches to content. With thinking off the prompt already holds an
empty, closed block and the generation is all content. A model that opens `<think>` itself at the very start of its
output (ignoring leading whitespace) is recognised too.

A tool call written inside the reasoning block must not be lost: an *implicit end marker* (by default the tool-call
openers) ends the reasoning without being consumed, so the marker and what follows reach the tool-call parser as
content.

Whitespace around the reasoning and at the start of the content is removed (the templates add newlines there).
`split_reasoning` is the whole-text answer written directly from these rules; `ReasoningParser` is the streaming
version and always agrees with it, whatever the chunking.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ninfer.frontend.stop_strings import partial_suffix_len

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_OPENERS = ("<tool_call>", "<function_calls>")


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str
    content: str
    # True when the reasoning block was closed (by `</think>` or an implicit end marker).
    reasoning_ended: bool


def split_reasoning(
    text: str,
    *,
    starts_in_reasoning: bool,
    start_tag: str = THINK_START,
    end_tag: str = THINK_END,
    implicit_end_markers: Sequence[str] = TOOL_CALL_OPENERS,
) -> ReasoningSplit:
    """Whole-text split. `starts_in_reasoning`: the prompt left a think block open."""
    if not starts_in_reasoning:
        stripped = text.lstrip()
        if not stripped.startswith(start_tag):
            return ReasoningSplit("", text, reasoning_ended=False)
        text = stripped[len(start_tag) :]
    found = [(text.find(m), m) for m in (end_tag, *implicit_end_markers) if m in text]
    if not found:
        return ReasoningSplit(text.strip(), "", reasoning_ended=False)
    pos, marker = min(found)
    if marker == end_tag:
        return ReasoningSplit(text[:pos].strip(), text[pos + len(end_tag) :].lstrip(), reasoning_ended=True)
    return ReasoningSplit(text[:pos].strip(), text[pos:], reasoning_ended=True)


@dataclass(frozen=True)
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


class _State(enum.Enum):
    MAYBE_OPENING = "maybe_opening"  # not yet known whether the output opens a think block itself
    REASONING = "reasoning"
    CONTENT_START = "content_start"  # after `</think>`: leading whitespace is dropped
    CONTENT = "content"


class ReasoningParser:
    """Streaming reasoning/content splitter. Feed decoded text; call `finish` at the end of the stream."""

    def __init__(
        self,
        *,
        starts_in_reasoning: bool,
        start_tag: str = THINK_START,
        end_tag: str = THINK_END,
        implicit_end_markers: Sequence[str] = TOOL_CALL_OPENERS,
    ) -> None:
        self._start_tag = start_tag
        self._end_tag = end_tag
        self._end_markers = (end_tag, *implicit_end_markers)
        self._state = _State.REASONING if starts_in_reasoning else _State.MAYBE_OPENING
        self._buf = ""
        self._reasoning_started = False  # leading whitespace of the reasoning is dropped
        self._reasoning_ended = False

    @property
    def in_reasoning(self) -> bool:
        return self._state is _State.REASONING

    @property
    def reasoning_ended(self) -> bool:
        return self._reasoning_ended

    @property
    def may_reason(self) -> bool:
        """The block is open, or may still open (only whitespace or part of the opening tag seen so far)."""
        return self._state in (_State.REASONING, _State.MAYBE_OPENING)

    def feed(self, piece: str) -> ReasoningDelta:
        self._buf += piece
        reasoning: list[str] = []
        content: list[str] = []
        while self._step(reasoning, content):
            pass
        return ReasoningDelta("".join(reasoning), "".join(content))

    def finish(self) -> ReasoningDelta:
        buf, self._buf = self._buf, ""
        if self._state is _State.MAYBE_OPENING:
            return ReasoningDelta(content=buf)
        if self._state is _State.REASONING:
            # Cut off inside the block: what was held (trailing whitespace, a partial tag) is reasoning text.
            return ReasoningDelta(reasoning=self._reasoning_text(buf).rstrip())
        if self._state is _State.CONTENT_START:
            return ReasoningDelta()
        return ReasoningDelta(content=buf)

    def _step(self, reasoning: list[str], content: list[str]) -> bool:
        """Consume what the current state can decide now; True if the state changed and there may be more."""
        buf = self._buf
        if self._state is _State.MAYBE_OPENING:
            stripped = buf.lstrip()
            if stripped.startswith(self._start_tag):
                self._buf = stripped[len(self._start_tag) :]
                self._state = _State.REASONING
                return True
            if self._start_tag.startswith(stripped):
                return False  # only whitespace or a partial opening tag so far
            content.append(buf)
            self._buf = ""
            self._state = _State.CONTENT
            return False
        if self._state is _State.REASONING:
            found = [(buf.find(m), m) for m in self._end_markers if m in buf]
            if found:
                pos, marker = min(found)
                reasoning.append(self._reasoning_text(buf[:pos]).rstrip())
                self._reasoning_ended = True
                if marker == self._end_tag:
                    self._buf = buf[pos + len(marker) :]
                    self._state = _State.CONTENT_START
                else:
                    self._buf = buf[pos:]
                    self._state = _State.CONTENT
                return True
            # Hold a possible partial marker, and trailing whitespace that may turn out to precede `</think>`.
            hold = partial_suffix_len(buf, self._end_markers)
            releasable = buf[: len(buf) - hold]
            kept = releasable.rstrip()
            reasoning.append(self._reasoning_text(kept))
            self._buf = buf[len(kept) :]
            return False
        if self._state is _State.CONTENT_START:
            stripped = buf.lstrip()
            self._buf = stripped
            if stripped:
                self._state = _State.CONTENT
                return True
            return False
        content.append(buf)
        self._buf = ""
        return False

    def _reasoning_text(self, text: str) -> str:
        if not self._reasoning_started:
            text = text.lstrip()
            self._reasoning_started = bool(text)
        return text
