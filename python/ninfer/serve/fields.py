"""The request fields that several routes carry, each typed once, so that every route validates (and the OpenAPI
document describes) a field the same way: the same type, the same bounds, the same message naming it."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16

# The engine samples in float32 with int32 counts (ninfer.engine.native_sampling): a value that must be positive
# is at least float32's smallest normal (a smaller one is 0 there), a count fits an int32.
FLOAT32_MIN = 2.0**-126
INT32_MAX = 2**31 - 1

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]  # min_p, xtc_probability, xtc_threshold
TopP = Annotated[float, Meta(ge=FLOAT32_MIN, le=1.0)]  # 0 would keep no token: the sampler refuses it
NonNegativeInt32 = Annotated[int, Meta(ge=0, le=INT32_MAX)]
TopK = NonNegativeInt32  # 0 disables it
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]  # presence_penalty, frequency_penalty
RepetitionPenalty = Annotated[float, Meta(ge=FLOAT32_MIN, le=10.0)]
Seed = Annotated[int, Meta(ge=0, extra_json_schema={"maximum": 2**64 - 1})]  # the engine refuses more (a 400)
# llama.cpp's sampler fields, with the ranges the engine's sampler accepts (cpp/runtime/sampler.cpp)
TypicalP = Annotated[float, Meta(ge=FLOAT32_MIN, le=1.0)]
TopNSigma = Annotated[float, Meta(ge=-100.0, le=100.0)]  # <= 0 disables it
Hundred = Annotated[float, Meta(ge=0.0, le=100.0)]  # dynatemp_range, dynatemp_exponent, dry_multiplier
DryBase = Annotated[float, Meta(ge=1.0, le=100.0)]
DryAllowedLength = NonNegativeInt32
LastN = Annotated[int, Meta(ge=-1, le=INT32_MAX)]  # repeat_last_n, dry_penalty_last_n: -1 looks at every token
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)]
TokenId = Annotated[int, Meta(ge=0)]
# OpenAI chat / completions (and llama.cpp): -1 means "until the end of the context" (llama.cpp's web UI sends it)
# (0 leaves nothing to generate: ninfer.serve.generation.build_request refuses it)
MaxTokens = Annotated[int, Meta(ge=-1, extra_json_schema={"not": {"const": 0}})]
# Responses' max_output_tokens and Messages' max_tokens: a count of tokens, at least one
OutputTokens = Annotated[int, Meta(ge=1)]
# chat / completions `stop`, Messages `stop_sequences`: the bound is documented here and enforced by
# ninfer.serve.openai_common.stop_strings, whose message names the field as the route's protocol spells it
StopStrings = Annotated[list[str], Meta(extra_json_schema={"maxItems": MAX_STOP_STRINGS})]
# llama.cpp's `dry_sequence_breakers`: each is looked for in every vocabulary entry when a request brings a new set
# (in a worker thread, ~7 ms a breaker over a 248k vocabulary), so a set is bounded: a million would hold a worker
# for hours. llama.cpp's default has four.
MAX_DRY_SEQUENCE_BREAKERS = 64
DrySequenceBreakers = Annotated[list[str], Meta(max_length=MAX_DRY_SEQUENCE_BREAKERS)]
