"""What the app serves of one loaded model: `ServedModel`, the engine plus how the server presents it.

Handlers get the loaded model a request names as `lease.served` (the `lease` dependency, ninfer.serve.gate).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ninfer.engine import Engine, SamplingParams
from ninfer.frontend.sampling_defaults import recommended_sampling
from ninfer.serve.generation import GenerationResult
from ninfer.serve.metrics import ServerMetrics

# max_tokens of a request that names none (the router config's `max_tokens` changes it; None: to the context's end).
DEFAULT_MAX_TOKENS = 2048


@dataclass(eq=False)
class ServedModel:
    """One loaded engine plus how the server presents it."""

    model_id: str  # the name clients see in /v1/models and in responses
    engine: Engine
    preserve_thinking: bool | None = None  # --preserve-thinking: keep earlier turns' reasoning in the prompt
    created: int = field(default_factory=lambda: int(time.time()))
    metrics: ServerMetrics | None = None
    sampling_override: Mapping[str, Any] = field(default_factory=dict)  # the router config's `sampling`
    default_max_tokens: int | None = DEFAULT_MAX_TOKENS

    def sampling_defaults(self, *, thinking: bool) -> SamplingParams:
        """What a request gets for the sampling fields it does not set (ninfer.frontend.sampling_defaults)."""
        return recommended_sampling(self.engine.info.arch, self.engine.frontend.generation_defaults,
                                    self.sampling_override, thinking=thinking)

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

    def record_disconnect_release(self, seconds: float) -> None:
        """Called once per generation cancelled by its client's disconnect: seconds from the server seeing the
        disconnect to the engine's lane (or queue place) being free."""
        if self.metrics is not None:
            self.metrics.disconnect_release.observe(seconds)
