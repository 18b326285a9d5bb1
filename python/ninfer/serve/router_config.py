"""The router's configuration: the models it may serve and how (`models.json`, or one model from the command line).

    config = load_config("models.json", defaults=EngineOptions(...))     # or single_model_config(path, name, ...)

Every key is checked when the config is read, with a message that names the file, the key and what is wrong, so that
a config the engine would refuse fails at start and not at the model's first load (docs/router.md has the keys).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ninfer.engine import MAX_DRAFT_TOKENS, OPTION_CHOICES, EngineOptions, SamplingParams, native_sampling
from ninfer.errors import NinferError
from ninfer.frontend.media_limits import MediaLimits
from ninfer.frontend.sampling_defaults import OVERRIDABLE
from ninfer.serve.state import DEFAULT_MAX_TOKENS

DEFAULT_HEALTH_CHECK_TIMEOUT_S = 120.0
DEFAULT_LOAD_WAIT_S = 300.0
DEFAULT_SSE_PING_S = 5.0  # keepalives of /models/sse

# Engine keys a model entry may carry, besides the router's own keys below.
ENGINE_KEYS = {f.name for f in fields(EngineOptions)} - {"verify_checksums"}
# Options of later issues: accepted by name so configs written for them fail with a clear message.
NOT_YET_KEYS = {"lm_head_draft": "the MTP draft's lm-head shortlist", "reserve_gib": "GPU memory planning"}
MODEL_KEYS = {"path", "aliases", "ttl", "preserve_thinking", "description", "sampling", "max_tokens"}
GLOBAL_KEYS = {"models", "ttl", "health_check_timeout", "load_wait_timeout", "sse_ping_interval", "max_tokens"}


class RouterConfigError(NinferError):
    """A router config that cannot be served: the message names the file, the key and what is wrong."""



@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: Path
    options: EngineOptions
    aliases: tuple[str, ...] = ()
    ttl_s: float | None = None  # None: the global TTL; 0: never unload when idle
    preserve_thinking: bool | None = None
    description: str = ""
    sampling: Mapping[str, Any] = field(default_factory=dict)  # over the recommended defaults (sampling_defaults)
    max_tokens: int | None = DEFAULT_MAX_TOKENS  # for requests that name none; None: to the end of the context


@dataclass(frozen=True)
class RouterConfig:
    models: tuple[ModelSpec, ...]
    ttl_s: float = 0.0  # global idle TTL; 0 = never
    health_check_timeout_s: float = DEFAULT_HEALTH_CHECK_TIMEOUT_S
    load_wait_s: float = DEFAULT_LOAD_WAIT_S
    sse_ping_interval_s: float = DEFAULT_SSE_PING_S


def _number(value: Any, where: str, *, minimum: float = 0.0, integer: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        raise RouterConfigError(f"{where} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if value < minimum:
        raise RouterConfigError(f"{where} must be >= {minimum:g}, got {value}")
    return value


def _ttl(value: Any, where: str) -> float | None:
    # llama-swap writes -1 for "use the global TTL".
    return None if value == -1 else float(_number(value, where))


def _global_ttl(value: Any, source: str) -> float:
    if value == -1:  # a model entry's "the global value": the global TTL itself has none to refer to
        raise RouterConfigError(f"{source}: ttl must be >= 0 (0: never unload), got -1 (-1 means the global ttl, "
                                "and only in a model entry)")
    return float(_number(value, f"{source}: ttl"))


def _max_tokens(value: Any, where: str) -> int | None:
    if value == -1:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RouterConfigError(f"{where} must be an integer >= 1, or -1 for no limit, got {json.dumps(value)}")
    return value


def _sampling(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise RouterConfigError(f"{where} must be an object of sampling values, got {json.dumps(value)}")
    unknown = value.keys() - set(OVERRIDABLE)
    if unknown:
        raise RouterConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: "
                                f"{', '.join(OVERRIDABLE)})")
    for key, v in value.items():
        _number(v, f"{where}.{key}", minimum=-math.inf, integer=SamplingParams.__dataclass_fields__[key].type == "int")
    try:
        native_sampling(SamplingParams(**value))
    except NinferError as exc:
        raise RouterConfigError(f"{where}: {exc}") from exc
    return dict(value)


def _media_limits(value: Any, default: MediaLimits, where: str) -> MediaLimits:
    """A model entry's "media_limits" object: some of MediaLimits' fields, the rest from `default`."""
    if not isinstance(value, Mapping):
        raise RouterConfigError(f"{where} must be an object of media limits, got {json.dumps(value)}")
    known = {f.name for f in fields(MediaLimits)}
    for name, limit in value.items():
        if name not in known:
            raise RouterConfigError(f"{where}: unknown limit {name!r} (known: {', '.join(sorted(known))})")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise RouterConfigError(f"{where}.{name} must be an integer >= 1, got {json.dumps(limit)}")
    return replace(default, **value)


def _engine_value(key: str, value: Any, default: Any, where: str) -> Any:
    """One engine key of a model entry, checked as EngineOptions' field `key` needs it (the engine itself would only
    refuse it at the model's first load)."""
    def refuse(allowed: str) -> RouterConfigError:
        return RouterConfigError(f"{where}.{key} must be {allowed}, got {json.dumps(value)}")

    if key == "media_limits":
        return _media_limits(value, default, f"{where}.{key}")
    if key == "kv_capacity":
        if value is None or value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise refuse('a number of tokens (an integer >= 1), "auto" or null')
        return value
    if key in OPTION_CHOICES:
        if value not in OPTION_CHOICES[key]:
            raise refuse("one of " + ", ".join(json.dumps(c) for c in OPTION_CHOICES[key]))
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise refuse("true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise refuse("an integer >= 0")
    return value


def _engine_options(entry: Mapping[str, Any], defaults: EngineOptions, where: str) -> EngineOptions:
    options = replace(defaults, **{key: _engine_value(key, entry[key], getattr(defaults, key), where)
                                   for key in ENGINE_KEYS & entry.keys()})
    if not 1 <= options.max_concurrency <= 8:
        raise RouterConfigError(f"{where}.max_concurrency must be in 1..8, got {options.max_concurrency}")
    if options.max_context < 1:
        raise RouterConfigError(f"{where}.max_context must be >= 1, got {options.max_context}")
    if options.spec == "mtp" and not 1 <= options.draft_tokens <= MAX_DRAFT_TOKENS:
        raise RouterConfigError(f"{where}.draft_tokens must be in 1..{MAX_DRAFT_TOKENS}, got {options.draft_tokens}")
    if options.prefill_chunk % 64:
        raise RouterConfigError(f"{where}.prefill_chunk must be a positive multiple of 64 or 0 (auto), "
                                f"got {options.prefill_chunk}")
    if options.decoding_prefill_chunk % 64:
        raise RouterConfigError(f"{where}.decoding_prefill_chunk must be a positive multiple of 64 or 0 (auto), "
                                f"got {options.decoding_prefill_chunk}")
    if options.prefill_chunk and options.decoding_prefill_chunk > options.prefill_chunk:
        raise RouterConfigError(f"{where}.decoding_prefill_chunk {options.decoding_prefill_chunk} is above "
                                f"prefill_chunk {options.prefill_chunk}")
    if options.snapshot_interval % 64:
        raise RouterConfigError(f"{where}.snapshot_interval must be a multiple of 64 or 0 (auto), "
                                f"got {options.snapshot_interval}")
    if not options.prefix_cache and (options.host_kv_mib or options.host_state_slots):
        raise RouterConfigError(f"{where}.host_kv_mib / host_state_slots keep prefix-cache contents: they need "
                                f"prefix_cache true")
    if 0 < options.device_state_slots < options.max_concurrency:
        raise RouterConfigError(f"{where}.device_state_slots ({options.device_state_slots}) must be 0 (auto) or at "
                                f"least max_concurrency ({options.max_concurrency}): one per lane")
    if isinstance(options.kv_capacity, int) and options.kv_capacity < options.max_context:
        raise RouterConfigError(f"{where}.kv_capacity ({options.kv_capacity}) must hold one full context "
                                f"(max_context {options.max_context})")
    return options


def _model_spec(name: str, entry: Any, defaults: EngineOptions, base: Path, where: str,
                max_tokens: int | None) -> ModelSpec:
    if not isinstance(entry, Mapping):
        raise RouterConfigError(f"{where} must be an object with a 'path', got {entry!r}")
    unknown = entry.keys() - MODEL_KEYS - ENGINE_KEYS - NOT_YET_KEYS.keys()
    if unknown:
        raise RouterConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: "
                                f"{', '.join(sorted(MODEL_KEYS | ENGINE_KEYS))})")
    for key in NOT_YET_KEYS.keys() & entry.keys():
        if entry[key] not in (None, False, "none"):
            raise RouterConfigError(f"{where}.{key}: {NOT_YET_KEYS[key]} is not implemented yet in this build")
    path = entry.get("path")
    if not isinstance(path, str) or not path:
        raise RouterConfigError(f"{where}.path must be the path of a .ninfer artifact")
    aliases = entry.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise RouterConfigError(f"{where}.aliases must be a list of names")
    thinking = entry.get("preserve_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise RouterConfigError(f"{where}.preserve_thinking must be true or false")
    description = entry.get("description", "")
    if not isinstance(description, str):
        raise RouterConfigError(f"{where}.description must be a string")
    return ModelSpec(name=name, path=(base / path) if not Path(path).is_absolute() else Path(path),
                     options=_engine_options(entry, defaults, where), aliases=tuple(aliases),
                     ttl_s=_ttl(entry["ttl"], f"{where}.ttl") if "ttl" in entry else None,
                     preserve_thinking=thinking, description=description,
                     sampling=_sampling(entry.get("sampling", {}), f"{where}.sampling"),
                     max_tokens=_max_tokens(entry["max_tokens"], f"{where}.max_tokens") if "max_tokens" in entry
                     else max_tokens)


def parse_config(data: Any, *, defaults: EngineOptions, source: str = "config",
                 base: Path = Path(".")) -> RouterConfig:
    """Validates a router config (already parsed JSON). Relative model paths are relative to `base`."""
    if not isinstance(data, Mapping):
        raise RouterConfigError(f"{source}: the top level must be an object with 'models'")
    unknown = data.keys() - GLOBAL_KEYS
    if unknown:
        raise RouterConfigError(f"{source}: unknown top-level key(s) {', '.join(sorted(unknown))} "
                                f"(known: {', '.join(sorted(GLOBAL_KEYS))})")
    models = data.get("models")
    if not isinstance(models, Mapping) or not models:
        raise RouterConfigError(f"{source}: 'models' must be a non-empty object of NAME: {{\"path\": ...}}")
    max_tokens = _max_tokens(data["max_tokens"], f"{source}: max_tokens") if "max_tokens" in data \
        else DEFAULT_MAX_TOKENS
    specs = tuple(_model_spec(name, entry, defaults, base, f"{source}: models.{name}", max_tokens)
                  for name, entry in models.items())
    seen: dict[str, str] = {}
    for spec in specs:
        for name in (spec.name, *spec.aliases):
            if name in seen:
                raise RouterConfigError(f"{source}: the name {name!r} of model {spec.name!r} is already used by "
                                        f"model {seen[name]!r}")
            seen[name] = spec.name
    return RouterConfig(
        models=specs,
        ttl_s=_global_ttl(data.get("ttl", 0), source),
        health_check_timeout_s=float(_number(data.get("health_check_timeout", DEFAULT_HEALTH_CHECK_TIMEOUT_S),
                                             f"{source}: health_check_timeout", minimum=0.001)),
        load_wait_s=float(_number(data.get("load_wait_timeout", DEFAULT_LOAD_WAIT_S),
                                  f"{source}: load_wait_timeout", minimum=0.001)),
        sse_ping_interval_s=float(_number(data.get("sse_ping_interval", DEFAULT_SSE_PING_S),
                                          f"{source}: sse_ping_interval", minimum=0.01)),
    )


def load_config(path: str | Path, *, defaults: EngineOptions) -> RouterConfig:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RouterConfigError(f"cannot read the router config {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise RouterConfigError(f"{path} is not JSON: {exc}") from exc
    return parse_config(data, defaults=defaults, source=str(path), base=path.parent)


def single_model_config(path: str | Path, name: str, options: EngineOptions,
                        preserve_thinking: bool | None = None) -> RouterConfig:
    """The one-model case (`ninfer-serve MODEL`): the same router, one entry, never unloaded when idle."""
    return RouterConfig(models=(ModelSpec(name, Path(path), options, preserve_thinking=preserve_thinking),))
