"""Stop strings matched across token boundaries of a text stream.

A stop string may be split over several decoded tokens, so the matcher holds back the shortest text that could
still grow into a stop (the longest suffix of the pending text that is a proper prefix of some stop) and releases
everything before it at once. The text before a stop is emitted; the stop itself and everything after it are not.

When several stops occur, the one that *completes first* wins (ties: the one that starts first). That is the only
rule a stream can follow without waiting for text that may never come, so `find_stop` uses it too and a stream
always agrees with the whole-text answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopMatch:
    """Where the first stop completes in a text: `text[:start]` is kept, `stop` is the matched string."""

    start: int
    stop: str


def find_stop(text: str, stops: Sequence[str]) -> StopMatch | None:
    """The first stop in `text` by completion position (ties: earliest start), or None."""
    best: tuple[int, int, str] | None = None
    for stop in stops:
        # For one stop string, its first occurrence is also the one that completes first.
        start = text.find(stop)
        if start >= 0 and (best is None or (start + len(stop), start) < best[:2]):
            best = (start + len(stop), start, stop)
    return None if best is None else StopMatch(start=best[1], stop=best[2])


@dataclass(frozen=True)
class StopFeed:
    """What one `feed` releases: `text` is safe to emit; `stop` is set once a stop matched (the stream is over)."""

    text: str
    stop: str | None = None


class StopStringMatcher:
    """Incremental stop-string matcher. Feed decoded text pieces; call `flush` at the end of the stream."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(dict.fromkeys(s for s in stops if s))  # empty stops would match everywhere
        self._held = ""
        self._stopped: str | None = None

    @property
    def held(self) -> str:
        """Text received but not yet released because it may be the start of a stop."""
        return self._held

    @property
    def stopped(self) -> str | None:
        """The stop string that ended the stream, if any."""
        return self._stopped

    def feed(self, piece: str) -> StopFeed:
        if self._stopped is not None:
            return StopFeed("", self._stopped)
        if not self._stops:
            return StopFeed(piece)
        pending = self._held + piece
        match = find_stop(pending, self._stops)
        if match is not None:
            self._held = ""
            self._stopped = match.stop
            return StopFeed(pending[: match.start], match.stop)
        keep = partial_suffix_len(pending, self._stops)
        self._held = pending[len(pending) - keep :]
        return StopFeed(pending[: len(pending) - keep])

    def flush(self) -> str:
        """End of stream without a stop: release what was held back."""
        held, self._held = self._held, ""
        return "" if self._stopped is not None else held


def partial_suffix_len(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`: the text a stream
    must hold back because the next piece may complete a marker. (A complete marker is the caller's business.)"""
    longest = max((len(m) for m in markers), default=0)
    for length in range(min(len(text), longest - 1), 0, -1):
        suffix = text[len(text) - length :]
        if any(m.startswith(suffix) for m in markers):
            return length
    return 0
