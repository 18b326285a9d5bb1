"""Ending a running generation's reasoning on request (llama.cpp's `reasoning_end` control action).

A chat request sent with `reasoning_control: true` (llama-ui always sends it) carries a `ReasoningControl` as its
engine token constraint. It follows the generated text through the reasoning split and leaves every step
unconstrained until `end_reasoning()` is called (by `POST /v1/chat/completions/control`); then, if the reasoning
block is still open, the next sampled tokens are forced, through the token mask, to be the tokens of `</think>`. The
generation goes on: the model continues with its answer after a block it now sees closed.

A structured-output constraint, when the request has one, is wrapped: it sees every token, forced ones included, so
its grammar switches on after the forced `</think>` as it would after a natural one.

A reasoning budget (llama.cpp's `thinking_budget_tokens` / `reasoning_budget_tokens`, which llama-ui sends for its
reasoning-effort levels) uses the same forced close: once the reasoning block has taken `budget` tokens, the control
ends it as if `end_reasoning()` had been called. The reasoning then holds at most `budget` tokens plus those of the
close.

Why opt-in: an armed request pays a mask round trip to Python before each sampled token, which unarmed requests
never do (llama.cpp's `reasoning_control` likewise arms its budget sampler only when asked).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ninfer.engine import TokenConstraint
from ninfer.frontend.reasoning import THINK_END, ReasoningParser
from ninfer.frontend.text import TextStream

if TYPE_CHECKING:
    from ninfer.frontend.text import Frontend


class ReasoningControl:
    """One request's reasoning watcher and forced close. `fill_next_mask` runs on the engine's pump thread,
    `end_reasoning` on the event loop: the lock keeps their view of the reasoning state consistent."""

    def __init__(self, frontend: Frontend, *, starts_in_reasoning: bool, inner: TokenConstraint | None = None,
                 budget: int | None = None) -> None:
        self._text = TextStream(frontend)
        # The same split the response uses (a tool-call opener inside the reasoning ends it too).
        self._reasoning = ReasoningParser(starts_in_reasoning=starts_in_reasoning)
        self._close = tuple(frontend.encode(THINK_END))
        self._inner = inner
        self._lock = threading.Lock()
        self._end_requested = False
        self._forcing: deque[int] = deque()  # tokens of the close still to force, one per step
        self.forced_at: int | None = None  # how many tokens had been generated when the close was forced
        self._generated = 0
        self._budget = budget  # reasoning tokens after which the block is closed; None: no limit
        self._reasoning_generated = 0  # tokens generated while the block was open (as usage counts them)

    def end_reasoning(self) -> bool:
        """Asks for the reasoning block to be closed at the next sampled token. False when it is not open (it has
        ended, or the model has not opened one)."""
        with self._lock:
            if self._end_requested:
                return True
            if not self._reasoning.in_reasoning:
                return False
            self._end_requested = True
            return True

    def fill_next_mask(self, new_token_ids: Sequence[int], mask: np.ndarray) -> bool:
        constrained = self._inner.fill_next_mask(new_token_ids, mask) if self._inner is not None else False
        with self._lock:
            token = self._advance(new_token_ids)
        if token is None:
            return constrained
        _force(mask, token)
        return True

    def fill_draft_masks(self, new_token_ids: Sequence[int], drafts: Sequence[int], masks: np.ndarray) -> list[bool]:
        """fill_next_mask for a speculative round (the inner constraint's draft rows, when it has them), cut to the
        rows no forced close can fall on: a forced token is the round's only row, and with a budget still running
        row i comes only while reasoning + i tokens stay under it (every draft counted as reasoning)."""
        if self._inner is None:
            rows = [False] * (len(drafts) + 1)
        elif hasattr(self._inner, "fill_draft_masks"):
            rows = list(self._inner.fill_draft_masks(new_token_ids, drafts, masks))
        else:
            rows = [self._inner.fill_next_mask(new_token_ids, masks[0])]
        with self._lock:
            token = self._advance(new_token_ids)
            if token is None and self._reasoning.may_reason and self._budget is not None:
                rows = rows[: max(1, self._budget - self._reasoning_generated)]
        if token is None:
            return rows
        _force(masks[0], token)
        return [True]

    def _advance(self, new_token_ids: Sequence[int]) -> int | None:
        """Follows the text by `new_token_ids` (under the lock); the token to force at this step, if any."""
        self._generated += len(new_token_ids)
        if self._reasoning.in_reasoning:
            self._reasoning_generated += len(new_token_ids)
        self._reasoning.feed(self._text.push(new_token_ids))
        if self._budget is not None and self._reasoning_generated >= self._budget:
            self._end_requested = True
        if self._end_requested and self.forced_at is None and self._reasoning.in_reasoning:
            self._forcing.extend(self._close)
            self.forced_at = self._generated
        return self._forcing.popleft() if self._forcing else None


def _force(mask: np.ndarray, token: int) -> None:
    mask[:] = 0
    mask[token >> 5] = np.uint32(1 << (token & 31))
