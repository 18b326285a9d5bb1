"""Wire pieces the OpenAI-style routes share: sampling fields, usage/timings objects, ids, stream error frames.

`SamplingFields` is a msgspec Struct base: a request struct that inherits it gets the sampling fields (OpenAI's
plus the llama.cpp extensions clients send: top_k, min_p, repeat_penalty) validated by type and range before the
handler runs, and `generation_params(body, max_tokens=...)` turns them into the pipeline's GenerationParams, refusing
what the engine cannot do (a non-empty `logit_bias`: the sampler has no per-token bias; `n` above MAX_CHOICES).
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from ninfer.engine import SAMPLER_ALIASES, SAMPLER_STAGES, SamplingParams, sampler_stages
from ninfer.errors import NinferError
from ninfer.serve.errors import InvalidRequestError, describe, openai_body
from ninfer.serve.fields import (
    MAX_STOP_STRINGS,
    DryAllowedLength,
    DryBase,
    DrySequenceBreakers,
    Hundred,
    LastN,
    Penalty,
    Probability,
    RepetitionPenalty,
    Seed,
    StopStrings,
    Temperature,
    TopK,
    TopNSigma,
    TopP,
    TypicalP,
)
from ninfer.serve.generation import (
    UNTIL_CONTEXT_END,
    GenerationParams,
    GenerationResult,
    GenerationUsage,
    LiveTimings,
    TokenLogprob,
    sampling_overrides,
)
from ninfer.serve.sse import sse_frame


def template_role(role: str) -> str:
    """The role a message of the OpenAI routes has for the chat template: OpenAI's `developer` (its newer name for
    the system prompt) is the template's `system`; Qwen3.5's template knows no other name for it and refuses any role
    it does not know."""
    return "system" if role == "developer" else role


# What `reasoning_effort` (chat) and `reasoning.effort` (Responses) may be.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
# `tool_choice` (chat, Responses): one of these, or an object naming a tool
ToolChoice = Literal["none", "auto", "required"] | dict[str, Any]



# `samplers`: llama.cpp's stage names and their other spellings (blank entries are skipped), at most
# MAX_SAMPLER_ENTRIES entries, documented here; sampler_order refuses any other name, naming the stages there are,
# and more entries. The bound: the sampler runs every entry for every token (each a pass over the candidates), so
# a 10 MB list (a million entries) would take seconds per token of the engine's step, which every lane shares;
# llama.cpp's chains have a dozen stages.
MAX_SAMPLER_ENTRIES = 64
_SAMPLER_NAME = rf"\s*({'|'.join(sorted({*SAMPLER_STAGES, *SAMPLER_ALIASES}))})?\s*"
SamplerNames = Annotated[str, Meta(extra_json_schema={
    "pattern": rf"^{_SAMPLER_NAME}(;{_SAMPLER_NAME}){{0,{MAX_SAMPLER_ENTRIES - 1}}}$"})]
SamplerList = Annotated[list[Annotated[str, Meta(extra_json_schema={"pattern": rf"^{_SAMPLER_NAME}$"})]],
                        Meta(extra_json_schema={"maxItems": MAX_SAMPLER_ENTRIES})]
# Choices per request: they run at once, a lane each, and an engine has at most 8 lanes (a model's
# max_concurrency bounds them further: ninfer.serve.generation.start_generations).
MAX_CHOICES = 8


class SamplingFields(msgspec.Struct, kw_only=True):
    model: str | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: Probability | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repeat_penalty: RepetitionPenalty | None = None  # llama.cpp's name
    repetition_penalty: RepetitionPenalty | None = None  # vLLM's name
    seed: Seed | None = None
    # llama.cpp's sampler fields (llama-ui's settings dialog sends them), in the ranges the engine accepts
    repeat_last_n: LastN | None = None
    typical_p: TypicalP | None = None
    typ_p: TypicalP | None = None  # llama-ui's name for typical_p
    top_n_sigma: TopNSigma | None = None
    dynatemp_range: Hundred | None = None
    dynatemp_exponent: Hundred | None = None
    xtc_probability: Probability | None = None
    xtc_threshold: Probability | None = None
    dry_multiplier: Hundred | None = None
    dry_base: DryBase | None = None
    dry_allowed_length: DryAllowedLength | None = None
    dry_penalty_last_n: LastN | None = None
    dry_sequence_breakers: DrySequenceBreakers | None = None
    samplers: SamplerNames | SamplerList | None = None  # the stage order: a list, or names separated by ';'
    stop: str | StopStrings | None = None
    # The next two bounds are documented here and enforced by choice_count and refuse_logit_bias, whose messages
    # say why (a lane per choice; no per-token bias in the sampler: only an empty object, which SDKs send, is taken).
    n: Annotated[int, Meta(ge=1, extra_json_schema={"maximum": MAX_CHOICES})] | None = None
    logit_bias: Annotated[dict[str, float], Meta(extra_json_schema={"maxProperties": 0})] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None

# The request fields that are SamplingParams fields of the same name and meaning (the rest are mapped by hand below).
SHARED_SAMPLING_FIELDS = tuple(name for name in SamplingFields.__struct_fields__
                               if name in SamplingParams.__dataclass_fields__ and name not in ("repetition_penalty",
                                                                                                 "typical_p"))


def advisory_tool_choice(requested: Any, *, forcing: bool, strict: bool) -> dict[str, Any] | None:
    """What a response says (under `ninfer.tool_choice`) when the request demanded a tool call or declared `strict`
    tools: the engine cannot force either, so the model was asked, not forced. None when neither was requested."""
    if not (forcing or strict):
        return None
    return {
        "requested": requested,
        "strict": strict,
        "enforced": False,
        "note": "tool_choice and strict are advisory: the model was asked, not forced",
    }




def choice_count(n: int | None) -> int:
    if n is not None and n > MAX_CHOICES:
        raise InvalidRequestError(
            f"n = {n}: at most {MAX_CHOICES} choices per request (they run at once, a lane each); send several "
            "requests for more", param="n")
    return 1 if n is None else n


def refuse_logit_bias(logit_bias: dict[str, float] | None) -> None:
    if logit_bias:
        raise InvalidRequestError(
            "logit_bias is not supported: the engine's sampler cannot bias token logits (send none, or {})",
            param="logit_bias",
        )


def sampler_order(samplers: str | list[str] | None) -> list[str] | None:
    """llama.cpp's `samplers` (a list, or one string of names separated by ';') as stage names; 400 for a name the
    sampler has no stage for, and for more than MAX_SAMPLER_ENTRIES entries (blank ones included)."""
    if samplers is None:
        return None
    entries = samplers.count(";") + 1 if isinstance(samplers, str) else len(samplers)  # counted before split
    if entries > MAX_SAMPLER_ENTRIES:
        raise InvalidRequestError(f"samplers: at most {MAX_SAMPLER_ENTRIES} entries, got {entries}",
                                  param="samplers")
    names = [n.strip() for n in (samplers.split(";") if isinstance(samplers, str) else samplers) if n.strip()]
    order, unknown = sampler_stages(names)
    if unknown:
        raise InvalidRequestError(f"samplers: {unknown[0]!r} is not a sampler this server has (it has "
                                  f"{', '.join(SAMPLER_STAGES)})", param="samplers")
    return order


def stop_strings(stop: str | list[str] | None, *, param: str = "stop") -> list[str]:
    """The non-empty stop strings, at most MAX_STOP_STRINGS; `param` is the field's name in the request's protocol
    (Messages calls it stop_sequences, and its error shape has no `param`, so the message names it too)."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequestError(f"{param}: at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}", param=param)
    return [s for s in stops if s]


def generation_params(
    body: SamplingFields,
    *,
    max_tokens: int | None,
    logprobs: bool = False,
    top_logprobs: int = 0,
    split_reasoning: bool = True,
    report_progress: bool = False,
) -> GenerationParams:
    refuse_logit_bias(body.logit_bias)
    return GenerationParams(
        max_tokens=UNTIL_CONTEXT_END if max_tokens is not None and max_tokens < 0 else max_tokens,
        sampling=sampling_overrides(
            **{name: getattr(body, name) for name in SHARED_SAMPLING_FIELDS},
            # llama.cpp's names, where the engine's differ
            repetition_penalty=body.repetition_penalty if body.repetition_penalty is not None else body.repeat_penalty,
            typical_p=body.typical_p if body.typical_p is not None else body.typ_p,
            penalty_last_n=body.repeat_last_n,
            order=sampler_order(body.samplers),
        ),
        dry_sequence_breakers=body.dry_sequence_breakers,
        stop=stop_strings(body.stop),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        split_reasoning=split_reasoning,
        report_progress=report_progress,
        n=choice_count(body.n),
    )


def logprob_json(lp: TokenLogprob) -> dict[str, Any]:
    """One generated token's logprob entry, as Chat (`logprobs.content[]`) and Responses (`output_text.logprobs[]`)
    both spell it."""
    return {
        "token": lp.token,
        "logprob": lp.logprob,
        "bytes": lp.bytes,
        "top_logprobs": [{"token": t, "logprob": v, "bytes": b} for t, v, b in lp.top],
    }


def include_usage(body: SamplingFields) -> bool:
    return bool((body.stream_options or {}).get("include_usage"))


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage_json(usage: GenerationUsage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def _llama_timings(prompt_n: int, prompt_s: float, cache_n: int, predicted_n: int, decode_s: float) -> dict[str, Any]:
    """llama.cpp's `timings` fields; the rate counts the tokens after the first (the first comes with the prompt)."""
    return {
        "prompt_n": prompt_n,
        "prompt_ms": prompt_s * 1000,
        "cache_n": cache_n,
        "predicted_n": predicted_n,
        "predicted_ms": decode_s * 1000,
        "predicted_per_second": (predicted_n - 1) / decode_s if decode_s > 0 else 0.0,
    }


def timings_json(result: GenerationResult) -> dict[str, Any]:
    """llama.cpp's `timings` object, which its web UI shows."""
    t, u = result.timings, result.usage
    timings = _llama_timings(u.prompt_tokens - u.cached_tokens, t.ttft_s - t.queue_s, u.cached_tokens,
                             u.completion_tokens, max(t.total_s - t.ttft_s, 0.0))
    timings["queue_ms"] = t.queue_s * 1000
    if t.draft_n:  # llama.cpp's speculative decoding fields, there only when the request drafted
        timings["draft_n"] = t.draft_n
        timings["draft_n_accepted"] = t.draft_n_accepted
    return timings


def live_timings_json(live: LiveTimings) -> dict[str, Any]:
    """`timings` of one streamed chunk (llama.cpp's `timings_per_token`): the figures so far, so that a client's
    tokens/s is live during the answer."""
    return _llama_timings(live.prompt_tokens, live.ttft_s, 0, live.completion_tokens, live.decode_s)


DONE_FRAME = sse_frame("[DONE]")  # how an OpenAI stream ends, after its last chunk or its error frame


def stream_error_frame(exc: NinferError) -> bytes:
    """A mid-stream failure as OpenAI streams it: one data frame holding the error object."""
    return sse_frame(openai_body(describe(exc)))
