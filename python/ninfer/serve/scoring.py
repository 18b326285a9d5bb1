"""`POST /v1/score` (per-token logprobs of a given text) and `POST /v1/rerank` (Jina's shape: a query and documents
-> relevance scores, sorted). Errors in OpenAI's envelope, with the decision routes' statuses (413 over a limit).

/v1/score takes one of:
- `text`: every token's logprob given the ones before it (the first token has none);
- `prompt` + `continuation`: the continuation's tokens given the prompt (each tokenized on its own, so the split is a
  token boundary);
- `messages`: a chat whose last message is the assistant's; the continuation is that message as the chat template
  renders it, the prompt everything before it (the template's generation prompt included).

/v1/rerank's relevance is a yes/no decision readout (ninfer.decisions): the query is the shared context, prefilled
once and forked per document; relevance_score = P(Yes) over {Yes, No}.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from litestar import Request, post

from ninfer.decisions.contract import TooLargeError
from ninfer.decisions.prompt import Labels, content_text
from ninfer.decisions.runner import run_questions
from ninfer.serve.decisions import limits_of, openai_handler
from ninfer.serve.disconnect import run_while_connected
from ninfer.serve.errors import InvalidRequestError
from ninfer.serve.gate import LeaseDependency
from ninfer.serve.openapi import JSON_OBJECT_BODY
from ninfer.serve.state import ServedModel

RERANK_SYSTEM = "You are a relevance judge. Decide whether documents are relevant to this query:\n"
RERANK_QUESTION = "Document:\n{document}\nIs the document relevant to the query? Answer with only Yes or No:"
HANDLERS = {Exception: openai_handler}


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidRequestError("the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("the body must be a JSON object")
    return data


def _string(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidRequestError(f"{key} must be a string", param=key)
    return value


def _chat_split(model: ServedModel, messages: Any) -> tuple[str, str]:
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)
            and messages[-1].get("role") == "assistant" and isinstance(messages[-1].get("content"), str)):
        raise InvalidRequestError("messages must be chat messages ending with an assistant message's text",
                                  param="messages")
    frontend = model.engine.frontend
    prompt = frontend.render(messages[:-1], add_generation_prompt=True).text
    whole = frontend.render(messages, add_generation_prompt=False).text
    if not whole.startswith(prompt):
        raise InvalidRequestError("this chat template renders the last message differently after its generation "
                                  "prompt; send prompt and continuation instead", param="messages")
    return prompt, whole[len(prompt):]


def _score_tokens(model: ServedModel, data: dict[str, Any]) -> tuple[list[int], int]:
    """The tokens and how many of them are the prompt (the rest are scored)."""
    frontend = model.engine.frontend
    text, prompt, continuation = _string(data, "text"), _string(data, "prompt"), _string(data, "continuation")
    given = [k for k in ("text", "prompt", "messages") if data.get(k) is not None]
    if len(given) != 1:
        raise InvalidRequestError("send exactly one of text, prompt (+ continuation) or messages")
    if text is not None:
        ids = frontend.encode(text)
        return ids, 1
    if data.get("messages") is not None:
        prompt, continuation = _chat_split(model, data["messages"])
    if not continuation:
        raise InvalidRequestError("continuation must be a non-empty string", param="continuation")
    head, tail = frontend.encode(prompt or ""), frontend.encode(continuation)
    if not head and frontend.bos_token_id is not None:
        head = [frontend.bos_token_id]
    if not head:
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    return head + tail, len(head)


@post("/v1/score", status_code=200, exception_handlers=HANDLERS, opt={JSON_OBJECT_BODY: True},
      summary="Per-token logprobs of a text, or of a continuation after a prompt or a chat")
async def score(request: Request, lease: LeaseDependency) -> dict[str, Any]:
    data = _json_object(await request.body())
    model = lease.served
    ids, n_prompt = await asyncio.to_thread(_score_tokens, model, data)
    if len(ids) < 2:
        raise InvalidRequestError("the text must be at least two tokens")
    logprobs = (await run_while_connected(request, model.engine.score(ids)))[n_prompt - 1:]
    scored = ids[n_prompt:]
    frontend = model.engine.frontend
    tokens = [{"id": t, "token": frontend.decode([t], skip_special_tokens=False), "logprob": lp}
              for t, lp in zip(scored, logprobs, strict=True)]
    total = math.fsum(logprobs)
    return {"object": "score", "model": model.model_id, "tokens": tokens, "logprob": total,
            "perplexity": math.exp(-total / len(logprobs)),
            "usage": {"prompt_tokens": n_prompt, "continuation_tokens": len(scored), "total_tokens": len(ids)}}


def _documents(data: dict[str, Any]) -> list[str]:
    docs = data.get("documents")
    if not isinstance(docs, list) or not docs:
        raise InvalidRequestError("documents must be a non-empty array", param="documents")
    out = []
    for i, d in enumerate(docs):
        text = d.get("text") if isinstance(d, dict) else d
        if not isinstance(text, str):
            raise InvalidRequestError(f"documents[{i}] must be a string or an object with a text string",
                                      param="documents")
        out.append(text)
    return out


@post("/v1/rerank", status_code=200, exception_handlers=HANDLERS, opt={JSON_OBJECT_BODY: True},
      summary="Jina rerank: documents sorted by relevance to the query (a yes/no decision per document)")
async def rerank(request: Request, lease: LeaseDependency) -> dict[str, Any]:
    data = _json_object(await request.body())
    query, docs = _string(data, "query"), _documents(data)
    if not query:
        raise InvalidRequestError("query must be a non-empty string", param="query")
    top_n = data.get("top_n", len(docs))
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        raise InvalidRequestError("top_n must be a positive integer", param="top_n")
    return_documents = data.get("return_documents", True)
    if not isinstance(return_documents, bool):
        raise InvalidRequestError("return_documents must be a boolean", param="return_documents")
    limits = limits_of(request)
    if len(docs) > limits.max_questions:
        raise TooLargeError(f"{len(docs)} documents; at most {limits.max_questions} per request")
    model = lease.served
    shared = [{"role": "system", "content": RERANK_SYSTEM + content_text(query)}]
    questions = [(RERANK_QUESTION.format(document=d), Labels(["Yes", "No"])) for d in docs]
    probs, input_tokens = await run_while_connected(request, run_questions(model.engine, shared, questions, limits))
    order = sorted(range(len(docs)), key=lambda i: -probs[i][0])[:top_n]
    results = [{"index": i, "relevance_score": probs[i][0], **({"document": {"text": docs[i]}} if return_documents
                                                              else {})} for i in order]
    return {"model": model.model_id, "usage": {"prompt_tokens": input_tokens, "total_tokens": input_tokens},
            "results": results}


route_handlers = [score, rerank]
