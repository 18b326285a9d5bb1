"""The request fields that several routes carry, each typed once, so that every route validates (and the OpenAPI
document describes) a field the same way: the same type, the same bounds, the same message naming it."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]  # top_p, min_p
TopK = Annotated[int, Meta(ge=0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]  # presence_penalty, frequency_penalty
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=10.0)]
Seed = Annotated[int, Meta(ge=0, extra_json_schema={"maximum": 2**64 - 1})]  # the engine refuses more (a 400)
# llama.cpp's sampler fields, with the ranges the engine's sampler accepts (cpp/runtime/sampler.cpp)
TypicalP = Annotated[float, Meta(gt=0.0, le=1.0)]
TopNSigma = Annotated[float, Meta(ge=-100.0, le=100.0)]  # <= 0 disables it
Hundred = Annotated[float, Meta(ge=0.0, le=100.0)]  # dynatemp_range, dynatemp_exponent, dry_multiplier
DryBase = Annotated[float, Meta(ge=1.0, le=100.0)]
LastN = Annotated[int, Meta(ge=-1)]  # repeat_last_n, dry_penalty_last_n: -1 looks at every token
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)]
TokenId = Annotated[int, Meta(ge=0)]
# OpenAI chat / completions (and llama.cpp): -1 means "until the end of the context" (llama.cpp's web UI sends it)
MaxTokens = Annotated[int, Meta(ge=-1)]
# Responses' max_output_tokens and Messages' max_tokens: a count of tokens, at least one
OutputTokens = Annotated[int, Meta(ge=1)]
# chat / completions `stop`, Messages `stop_sequences`: the bound is documented here and enforced by
# ninfer.serve.openai_common.stop_strings, whose message names the field as the route's protocol spells it
StopStrings = Annotated[list[str], Meta(extra_json_schema={"maxItems": MAX_STOP_STRINGS})]
