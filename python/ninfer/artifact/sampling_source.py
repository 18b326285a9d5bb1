"""The sampling values a source recommends, as an artifact carries them (`frontend.generation_defaults`, in the
engine's SamplingParams names; docs/artifact-format.md). The server's layered defaults read them
(ninfer.frontend.sampling_defaults).

    hf_sampling_defaults(generation_config, where)    # a Hugging Face generation_config.json
    gguf_sampling_defaults(metadata, where)           # a GGUF file's general.sampling.* keys

The GGUF keys are llama.cpp's (gguf-py's `Keys.General.SAMPLING_*`, which llama.cpp's loader reads when the user
sets none). `general.sampling.sequence` is llama.cpp's sampler order, stage names separated by ';'. What the engine
has no sampler for is left out, with a warning: GGUF `mirostat` (its tau and eta with it), and a sequence naming a
stage it lacks. A value of the wrong type or outside the engine's range is a ConversionError naming the key: served,
it would have every request that leaves that field refused. HF's `do_sample` is not carried: as llama.cpp's own
converter does, the sampling values stand whatever it says (a greedy default would loop).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from ninfer.errors import ConversionError, NinferError

log = logging.getLogger(__name__)

# source key -> SamplingParams field
HF_KEYS = {name: name for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                   "presence_penalty", "frequency_penalty")}
GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.xtc_probability": "xtc_probability",
    "general.sampling.xtc_threshold": "xtc_threshold",
    "general.sampling.penalty_last_n": "penalty_last_n",
    "general.sampling.penalty_repeat": "repetition_penalty",
}
GGUF_SEQUENCE = "general.sampling.sequence"
GGUF_MIROSTAT = "general.sampling.mirostat"
ORDER = "order"  # the SamplingParams field a sequence becomes


def hf_sampling_defaults(generation_config: Mapping[str, Any], where: str) -> dict[str, Any]:
    return _checked({HF_KEYS[k]: (k, v) for k, v in generation_config.items() if k in HF_KEYS and v is not None},
                    where)


def gguf_sampling_defaults(metadata: Callable[[str], Any], where: str) -> dict[str, Any]:
    """`metadata(key)`: the file's value of `key`, or None."""
    found = {name: (key, value) for key, name in GGUF_KEYS.items() if (value := metadata(key)) is not None}
    mirostat = metadata(GGUF_MIROSTAT)
    if mirostat not in (None, 0):
        log.warning("%s: %s = %s is not carried: the engine has no mirostat sampler (its other values are)",
                    where, GGUF_MIROSTAT, mirostat)
    defaults = _checked(found, where)
    sequence = metadata(GGUF_SEQUENCE)
    if sequence is not None:
        order = _stage_order(sequence, where)
        if order is not None:
            defaults[ORDER] = order
    return defaults


def _checked(found: Mapping[str, tuple[str, Any]], where: str) -> dict[str, Any]:
    """{field: value} of {field: (source key, value)}, each value checked against the engine's range."""
    from ninfer.engine import SamplingParams, native_sampling

    types = {f: SamplingParams.__dataclass_fields__[f].type for f in found}
    defaults: dict[str, Any] = {}
    for name, (key, value) in found.items():
        integer = types[name] == "int"
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not number or integer and value != int(value):
            raise ConversionError(f"{where}: {key} = {value!r} is not {'an integer' if integer else 'a number'}")
        defaults[name] = int(value) if integer else float(value)
        try:
            native_sampling(SamplingParams(**{name: defaults[name]}))
        except NinferError as exc:
            raise ConversionError(f"{where}: {key} = {value!r}: {exc}") from None
    return defaults


def _stage_order(sequence: Any, where: str) -> list[str] | None:
    from ninfer.engine import sampler_stages

    if not isinstance(sequence, str):
        raise ConversionError(f"{where}: {GGUF_SEQUENCE} = {sequence!r} is not a string")
    order, missing = sampler_stages([n.strip() for n in sequence.split(";") if n.strip()])
    if missing:
        log.warning("%s: %s = %r is not carried: the engine has no %s sampler (the default order applies)",
                    where, GGUF_SEQUENCE, sequence, ", ".join(missing))
        return None
    return order
