"""The HTTP requests that pinned a model, and the generations each runs: what /slots shows, what
`/v1/chat/completions/control` addresses, and which engine failures the dashboard lists.

A `Call` is made by the model gate (ninfer.serve.gate) for each gated request and handed to its route with the lease.
The generation pipeline registers each engine request on it (`Call.track`); the returned `Activity` is the engine's
observer of that request (Engine.submit's `observer`), so it follows the request's progress without anything
standing between the route and the engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ninfer.engine import Engine, GenerationEvent, TokenConstraint
from ninfer.errors import EngineBusyError, NinferError, OutOfMemoryError
from ninfer.serve.reasoning_control import ReasoningControl


@dataclass(eq=False)
class Activity:
    """One engine generation of a call, as it progresses (a GenerationObserver)."""

    engine: Engine
    n_prompt: int
    request_id: int | None = None
    n_decoded: int = 0
    n_cached: int = 0  # prompt tokens the prefix cache served (known from its first event)
    finish_reason: str | None = None
    cancel_requested: bool = False
    reasoning: ReasoningControl | None = None  # armed by the request's reasoning_control
    # The engine let go of it (GenerationObserver.released): a generation whose client left is done for control as
    # soon as its stream closes, but it holds its lane and KV until the engine's step boundary frees them.
    engine_released: bool = False

    @property
    def holds_engine(self) -> bool:
        """Submitted and not yet let go by the engine: in a lane or queued, as engine.stats() counts it."""
        return self.request_id is not None and not self.engine_released

    def cancel(self) -> bool:
        self.cancel_requested = True
        if self.request_id is not None:
            self.engine.cancel(self.request_id)
        return True

    def submitted(self, request_id: int) -> None:
        self.request_id = request_id
        if self.cancel_requested:  # control's stop came while the request was being prepared
            self.engine.cancel(request_id)

    def received(self, event: GenerationEvent) -> None:
        self.n_decoded += len(event.token_ids)
        self.n_cached = event.progress.cached if event.progress is not None else event.cached_tokens
        self.finish_reason = event.finish_reason

    def ended(self) -> None:
        if self.finish_reason is None:
            self.finish_reason = "cancelled"

    def released(self) -> None:
        self.engine_released = True


@dataclass(eq=False)
class Call:
    """One HTTP request that pinned a model: what /slots shows and what the control route addresses."""

    call_id: int
    model: str
    path: str
    conversation_id: str | None
    started: float = field(default_factory=time.time)
    completion_ids: set[str] = field(default_factory=set)  # the ids of the responses it answers with
    generations: list[Activity] = field(default_factory=list)

    def track(self, engine: Engine, n_prompt: int, constraint: TokenConstraint | None) -> Activity:
        """A new generation of this call, to observe its engine request."""
        control = constraint if isinstance(constraint, ReasoningControl) else None
        activity = Activity(engine, n_prompt=n_prompt, reasoning=control)
        self.generations.append(activity)
        return activity

    def cancel(self) -> int:
        """Cancels this request's running generations; returns how many were asked to stop."""
        return sum(g.cancel() for g in self.generations if g.finish_reason is None)

    def holds_engine(self, engine: Engine | None) -> bool:
        """Whether `engine` still holds one of this request's generations (Activity.holds_engine)."""
        return any(g.holds_engine and g.engine is engine for g in self.generations)

    def reasoning_controls(self) -> list[ReasoningControl]:
        """The reasoning controls of this request's running generations (those sent with reasoning_control)."""
        return [g.reasoning for g in self.generations if g.finish_reason is None and g.reasoning is not None]


def failure_summary(exc: NinferError, *, started: bool) -> str | None:
    """What a supervisor reads of an engine error that ended a request, on one line; None for a request the engine
    refused as invalid before starting it (the client's mistake, answered with a 400)."""
    reason = " ".join(str(exc).split())
    if isinstance(exc, EngineBusyError):
        return f"429 engine full: {reason}"
    if started:
        return f"generation ended by an engine error: {reason}"
    if isinstance(exc, OutOfMemoryError):
        return f"request refused, out of memory: {reason}"
    return None
