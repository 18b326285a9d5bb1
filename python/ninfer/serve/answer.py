"""The one path of every generation route, after it has translated its body:

    prepared = await prepare(lease.served, ChatPrompt(...) or TextPrompt(...), GenerationParams(...),
                             output_format=fmt, format_param="response_format")     # render, tokenize, constrain
    return await answer(request, lease, prepared, response_id=shape.id,
                        whole=lambda generation: ...,                  # -> the response body
                        stream=(lambda generation: sse_response(...)) if body.stream else None)

`answer` starts the generation (admission errors, e.g. 429, are raised here, before any response is started),
registers the response id on the lease's call (what `/v1/chat/completions/control` addresses), then returns the
stream, or runs the whole answer while its client stays connected (ninfer.serve.disconnect). `answer_choices` does
the same for a protocol with `n` (GenerationParams.n): its `whole` and `stream` take the list of the n choices'
generations.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from litestar import Request

from ninfer.serve.disconnect import run_while_connected
from ninfer.serve.generation import (
    ChatPrompt,
    Generation,
    GenerationParams,
    PreparedPrompt,
    ServedModel,
    TextPrompt,
    dry_breakers,
    prepare_prompt,
    start_generations,
)
from ninfer.serve.router import Lease
from ninfer.serve.sse import SSEStream
from ninfer.serve.structured import OutputFormat, build_constraint


@dataclass(frozen=True)
class Prepared:
    """A generation request ready to start: its rendered prompt, its parameters (constraint included) and the tools
    whose calls are parsed out of the answer."""

    prompt: PreparedPrompt
    params: GenerationParams
    tools: Sequence[Mapping[str, Any]] | None


async def prepare(served: ServedModel, prompt: ChatPrompt | TextPrompt, params: GenerationParams, *,
                  output_format: OutputFormat | None = None, format_param: str = "") -> Prepared:
    """Renders and tokenizes the prompt and, for structured output, builds its constraint (`format_param` names
    the request field in a refusal)."""
    rendered = await prepare_prompt(served, prompt)
    breakers = dry_breakers(served, rendered, params)
    if breakers is not None:  # a scan of the vocabulary, cached by the frontend for build_request
        await asyncio.to_thread(served.engine.frontend.tokens_containing, breakers)
    if output_format is not None:  # one per choice: a constraint keeps its request's state
        constraints = [await build_constraint(served.engine, output_format, format_param,
                                              starts_in_reasoning=rendered.starts_in_reasoning)
                       for _ in range(params.n)]
        params = replace(params, constraint=constraints[0], choice_constraints=tuple(constraints[1:]))
    return Prepared(rendered, params, prompt.shown_tools if isinstance(prompt, ChatPrompt) else None)


async def answer(request: Request, lease: Lease, prepared: Prepared, *, response_id: str,
                 whole: Callable[[Generation], Awaitable[Any]],
                 stream: Callable[[Generation], SSEStream] | None = None) -> Any:
    """Starts the prepared generation and answers with `stream(generation)` when given, else with the body
    `whole(generation)` computes (cancelled if the client leaves first)."""
    prepared = replace(prepared, params=replace(prepared.params, n=1))
    return await answer_choices(
        request, lease, prepared, response_id=response_id, whole=lambda generations: whole(generations[0]),
        stream=(lambda generations: stream(generations[0])) if stream is not None else None)


async def answer_choices(request: Request, lease: Lease, prepared: Prepared, *, response_id: str,
                         whole: Callable[[list[Generation]], Awaitable[Any]],
                         stream: Callable[[list[Generation]], SSEStream] | None = None) -> Any:
    """`answer` for the `prepared.params.n` choices of one request (ninfer.serve.generation.start_generations)."""
    generations = start_generations(lease.served, prepared.prompt, prepared.params, tools=prepared.tools,
                                    call=lease.call)
    if lease.call is not None:
        lease.call.completion_ids.add(response_id)
    if stream is not None:
        return stream(generations)
    return await run_while_connected(request, whole(generations))
