"""The sampling values a request gets for the fields it does not set, per served model.

    defaults = recommended_sampling(arch, artifact_defaults, override, thinking=True)   # -> SamplingParams

Layers, later ones winning:
1. llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05): what a GGUF model gets in llama.cpp,
   and a sane floor for any model whose artifact carries none (sampling at temperature 1 over the whole vocabulary
   writes nonsense with small models).
2. For the Qwen3.5 family (Qwen3.5 / 3.6 / 3.8 share the model card's advice): the card's recommended values for
   general tasks, in thinking and non-thinking mode.
3. The artifact's own `generation_defaults`, which `ninfer convert` took from its source (the HF checkpoint's
   generation_config.json, a GGUF file's general.sampling.* keys, stage order included: ninfer.artifact.
   sampling_source). For Qwen3.5 those are the thinking-mode values, so a chat request with thinking off keeps the
   card's non-thinking ones (plain prompts count as thinking mode: the artifact's values apply).
4. The router config's per-model `sampling` object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from ninfer.artifact.format import QWEN35_FAMILY
from ninfer.engine import SamplingParams

LLAMA_CPP_DEFAULTS: dict[str, Any] = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
# The Qwen3.5 model cards' recommended settings for general tasks. The cards also suggest a presence penalty (up to
# 1.5) against endless repetition; it is not a default here, since a penalty changes even a greedy (temperature 0)
# answer: a router config's `sampling` sets it per model.
QWEN35_THINKING: dict[str, Any] = {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
QWEN35_NON_THINKING: dict[str, Any] = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0}
# What a router config's `sampling` may set: the numeric fields of SamplingParams (not the seed, breakers or order).
OVERRIDABLE = tuple(f.name for f in fields(SamplingParams) if f.type in ("float", "int"))
# What an artifact's generation_defaults may set: those and the stage order (a GGUF file's sequence).
ARTIFACT_FIELDS = (*OVERRIDABLE, "order")


def recommended_sampling(arch: str, artifact: Mapping[str, Any], override: Mapping[str, Any], *,
                         thinking: bool) -> SamplingParams:
    values = dict(LLAMA_CPP_DEFAULTS)
    qwen35 = arch in QWEN35_FAMILY
    if qwen35:
        values.update(QWEN35_THINKING if thinking else QWEN35_NON_THINKING)
    if thinking or not qwen35:
        values.update({k: v for k, v in artifact.items() if k in ARTIFACT_FIELDS})
    values.update(override)
    return SamplingParams(**{**values, "order": tuple(values.get("order", ()))})
