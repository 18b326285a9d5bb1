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

from ninfer.serve.answer import answer_choices, prepare
from ninfer.serve.errors import InvalidRequestError
from ninfer.serve.fields import MaxTokens, TokenId
from ninfer.serve.gate import LeaseDependency
from ninfer.serve.generation import (
    Generation,
    GenerationResult,
    TextPrompt,
    TokenLogprob,
    combined_usage,
    merged_deltas,
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
    # a string, token ids, or a batch of one of either (msgspec allows one list type per union, so the document
    # states the rest: all token ids, or one item; _prompt refuses any other list); none of them empty
    prompt: NonEmptyText | Annotated[list[TokenId | NonEmptyText | NonEmptyTokenIds], Meta(
        min_length=1, extra_json_schema={"anyOf": [{"items": {"type": "integer"}}, {"maxItems": 1}]})]
    max_tokens: MaxTokens | None = DEFAULT_MAX_TOKENS
    logprobs: Annotated[int, Meta(ge=0, le=MAX_LEGACY_LOGPROBS)] | None = None
    echo: bool = False
    # neither is served: documented as their no-op values, refused otherwise by _refuse_unsupported (which says so)
    suffix: Annotated[str, Meta(extra_json_schema={"maxLength": 0})] | None = None
    best_of: Annotated[int, Meta(ge=1, extra_json_schema={"maximum": 1})] | None = None


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


def _choice(index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}


async def _chunks(
    shape: _Shape, generations: list[Generation], echo: str, logprobs: bool, usage: bool
) -> AsyncIterator[bytes]:
    """The choices' chunks as they come (each with its choice's index), each choice's final chunk when it ends,
    then the usage of them all."""
    offsets = [len(echo)] * len(generations)
    if echo:
        for index in range(len(generations)):
            yield sse_frame(shape.object([_choice(index, echo, None, None)]))
    async for index, delta in merged_deltas(generations):
        if delta is None:  # this choice has ended
            result = generations[index].result
            assert result is not None
            yield sse_frame(shape.object([_choice(index, "", result.finish_reason, None)],
                                         timings=timings_json(result)))
        elif delta.content or (logprobs and delta.logprobs):
            lps = _logprobs_json(list(delta.logprobs), offsets[index]) if logprobs else None
            yield sse_frame(shape.object([_choice(index, delta.content, None, lps)]))
            offsets[index] += len(delta.content)
    if usage:
        results = [g.result for g in generations]
        yield sse_frame(shape.object([], usage=usage_json(combined_usage(results))))  # type: ignore[arg-type]
    yield sse_frame("[DONE]")


def completion_json(shape: _Shape, results: list[GenerationResult], echo: str, logprobs: bool) -> dict[str, Any]:
    """Every choice's text (their usage combined; timings are the first choice's)."""
    choices = [_choice(index, echo + result.content, result.finish_reason,
                       _logprobs_json(result.logprobs, len(echo)) if logprobs else None)
               for index, result in enumerate(results)]
    return shape.object(choices, usage=usage_json(combined_usage(results)), timings=timings_json(results[0]))


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

    async def whole(generations: list[Generation]) -> dict[str, Any]:
        async for _ in merged_deltas(generations):
            pass
        return completion_json(shape, [g.result for g in generations], echo, want_logprobs)  # type: ignore[misc]

    return await answer_choices(
        request, lease, prepared, response_id=shape.id, whole=whole,
        stream=(lambda generations: sse_response(
            _chunks(shape, generations, echo, want_logprobs, include_usage(data)), on_error=stream_error_frame,
            final_frame=DONE_FRAME,
        )) if data.stream else None,
    )


route_handlers = [completions]
