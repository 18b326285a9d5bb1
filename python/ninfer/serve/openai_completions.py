"""OpenAI (legacy) Completions: `POST /v1/completions` (and llama.cpp's `/completions`).

The prompt is text or token ids, generated from as is (no template, no reasoning split, no tool parsing).
`max_tokens` defaults to 16 as in OpenAI's API. One prompt per request; `n`/`best_of` > 1, `suffix` and a
non-empty `logit_bias` are refused. `logprobs: K` returns the legacy object (tokens, token_logprobs,
top_logprobs as {token: logprob} maps, text_offset).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from litestar import Request, post
from litestar.params import JSONBody
from msgspec import Meta

from ninfer.serve.answer import answer, prepare
from ninfer.serve.errors import InvalidRequestError
from ninfer.serve.fields import MaxTokens, TokenId
from ninfer.serve.gate import LeaseDependency
from ninfer.serve.generation import (
    Generation,
    GenerationResult,
    TextPrompt,
    TokenLogprob,
)
from ninfer.serve.openai_common import (
    DONE_FRAME,
    SamplingFields,
    generation_params,
    include_usage,
    new_id,
    stream_error_frame,
    timings_json,
    usage_json,
)
from ninfer.serve.sse import sse_frame, sse_response

DEFAULT_MAX_TOKENS = 16
MAX_LEGACY_LOGPROBS = 5  # OpenAI's cap on the legacy `logprobs: K`
NonEmptyText = Annotated[str, Meta(min_length=1)]
NonEmptyTokenIds = Annotated[list[TokenId], Meta(min_length=1)]


class CompletionRequest(SamplingFields, kw_only=True):
    # a string, token ids, or a batch of one of either (msgspec allows one list type per union); none of them empty
    prompt: NonEmptyText | Annotated[list[TokenId | NonEmptyText | NonEmptyTokenIds], Meta(min_length=1)]
    max_tokens: MaxTokens | None = DEFAULT_MAX_TOKENS
    logprobs: Annotated[int, Meta(ge=0, le=MAX_LEGACY_LOGPROBS)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Annotated[int, Meta(ge=1)] | None = None


def _prompt(body: CompletionRequest) -> TextPrompt:
    prompt = body.prompt
    if isinstance(prompt, str):
        return TextPrompt(text=prompt)
    if all(isinstance(p, int) for p in prompt):
        return TextPrompt(token_ids=prompt)  # type: ignore[arg-type]
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return TextPrompt(text=prompt[0])
    if len(prompt) == 1 and isinstance(prompt[0], list):
        return TextPrompt(token_ids=prompt[0])
    raise InvalidRequestError(
        "send exactly one prompt per request (a string or a list of token ids)", param="prompt"
    )


def _refuse_unsupported(body: CompletionRequest) -> None:
    if body.best_of is not None and body.best_of > 1:
        raise InvalidRequestError("best_of > 1 is not supported", param="best_of")
    if body.suffix:
        raise InvalidRequestError("suffix (fill-in-the-middle) is not supported", param="suffix")


def _logprobs_json(logprobs: list[TokenLogprob], offset: int) -> dict[str, Any]:
    text_offset, position = [], offset
    for lp in logprobs:
        text_offset.append(position)
        position += len(lp.token)
    return {
        "tokens": [lp.token for lp in logprobs],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [{t: v for t, v, _ in lp.top} for lp in logprobs],
        "text_offset": text_offset,
    }


class _Shape:
    def __init__(self, model_id: str) -> None:
        self.id = new_id("cmpl")
        self.created = int(time.time())
        self.model = model_id

    def object(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "ninfer",
            "choices": choices,
            **extra,
        }


def _choice(text: str, finish_reason: str | None, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}


async def _chunks(
    shape: _Shape, generation: Generation, echo: str, logprobs: bool, usage: bool
) -> AsyncIterator[bytes]:
    offset = len(echo)
    if echo:
        yield sse_frame(shape.object([_choice(echo, None, None)]))
    async for delta in generation.deltas():
        if delta.content or (logprobs and delta.logprobs):
            lps = _logprobs_json(list(delta.logprobs), offset) if logprobs else None
            yield sse_frame(shape.object([_choice(delta.content, None, lps)]))
            offset += len(delta.content)
    result = generation.result
    assert result is not None
    yield sse_frame(shape.object([_choice("", result.finish_reason, None)], timings=timings_json(result)))
    if usage:
        yield sse_frame(shape.object([], usage=usage_json(result.usage)))
    yield sse_frame("[DONE]")


def completion_json(shape: _Shape, result: GenerationResult, echo: str, logprobs: bool) -> dict[str, Any]:
    lps = _logprobs_json(result.logprobs, len(echo)) if logprobs else None
    return shape.object(
        [_choice(echo + result.content, result.finish_reason, lps)],
        usage=usage_json(result.usage),
        timings=timings_json(result),
    )


@post(["/v1/completions", "/completions"], status_code=200, summary="OpenAI Completions")
async def completions(data: JSONBody[CompletionRequest], lease: LeaseDependency, request: Request) -> Any:
    _refuse_unsupported(data)
    model = lease.served
    want_logprobs = data.logprobs is not None
    params = generation_params(
        data, max_tokens=data.max_tokens, logprobs=want_logprobs, top_logprobs=data.logprobs or 0
    )
    prepared = await prepare(model, _prompt(data), params)
    prompt = prepared.prompt
    echo = ""
    if data.echo:
        echo = prompt.text if prompt.text is not None else model.engine.frontend.decode(prompt.token_ids)
    shape = _Shape(model.model_id)

    async def whole(generation: Generation) -> dict[str, Any]:
        return completion_json(shape, await generation.run(), echo, want_logprobs)

    return await answer(
        request, lease, prepared, response_id=shape.id, whole=whole,
        stream=(lambda generation: sse_response(
            _chunks(shape, generation, echo, want_logprobs, include_usage(data)), on_error=stream_error_frame,
            final_frame=DONE_FRAME,
        )) if data.stream else None,
    )


route_handlers = [completions]
