"""What the app serves: a `ModelRouter` over `ServedModel`s, reached by handlers through dependency injection.

Today the router holds one model and answers every `model` name with it (as llama.cpp does with one model);
the router issue grows it into many models without changing the handlers, which only ever call
`router.resolve(name)`.

Handlers declare `router: ModelRouter` and get it from the `router` dependency (`DEPENDENCIES` below), or
`model: ServedModel` for the model named in the request body via `router.resolve(body.model)`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from litestar.datastructures import State
from litestar.di import Provide

from ninfer.engine import Engine
from ninfer.serve.generation import GenerationResult
from ninfer.serve.metrics import ServerMetrics


@dataclass(eq=False)
class ServedModel:
    """One loaded engine plus how the server presents it."""

    model_id: str  # the name clients see in /v1/models and in responses
    engine: Engine
    preserve_thinking: bool | None = None  # --preserve-thinking: keep earlier turns' reasoning in the prompt
    created: int = field(default_factory=lambda: int(time.time()))
    metrics: ServerMetrics | None = None

    def record_generation(self, result: GenerationResult) -> None:
        """Called by the generation pipeline once per finished generation."""
        if self.metrics is None:
            return
        m = self.metrics
        m.generations.labels(finish_reason=result.finish_reason).inc()
        m.prompt_tokens.inc(result.usage.prompt_tokens)
        m.cached_tokens.inc(result.usage.cached_tokens)
        m.generated_tokens.inc(result.usage.completion_tokens)
        if result.usage.completion_tokens:
            m.ttft.observe(result.timings.ttft_s)
        if result.usage.completion_tokens > 1:
            decode_s = max(result.timings.total_s - result.timings.ttft_s, 0.0)
            m.token_latency.observe(decode_s / (result.usage.completion_tokens - 1))


class ModelRouter:
    """The served models by name. One model now: every name resolves to it."""

    def __init__(self, model: ServedModel) -> None:
        self._model = model
        self.metrics = ServerMetrics(model.engine.stats)
        model.metrics = self.metrics

    @property
    def models(self) -> list[ServedModel]:
        return [self._model]

    def resolve(self, name: str | None = None) -> ServedModel:
        """The model a request names (None or any name: the one model)."""
        return self._model

    def close(self) -> None:
        for model in self.models:
            model.engine.close()


def _router(state: State) -> ModelRouter:
    return state.router


DEPENDENCIES = {"router": Provide(_router, sync_to_thread=False)}
