"""Routes around generation: health, model listing (OpenAI and llama.cpp shapes), tokenizer and template tools,
Prometheus metrics.

`/tokenize`, `/detokenize` and `/apply-template` take llama.cpp's bodies: `{content, add_special, with_pieces}`,
`{tokens}`, and a chat body (`messages`, `tools`, `chat_template_kwargs`...) -> `{prompt}`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Response, get, post
from litestar.params import JSONBody

from ninfer.serve.custom_tools import ChatTool, chat_form_tools
from ninfer.serve.errors import InvalidRequestError
from ninfer.serve.fields import TokenId
from ninfer.serve.gate import LeaseDependency, RouterDependency
from ninfer.serve.generation import ChatPrompt, prepare_prompt
from ninfer.serve.llamacpp import model_rows
from ninfer.serve.metrics import CONTENT_TYPE
from ninfer.serve.openai_chat import ChatMessages, template_messages
from ninfer.serve.state import ServedModel

PUBLIC = {"public": True}


@get(["/health", "/v1/health"], opt=PUBLIC, summary="Liveness: 200 as soon as the server is up, before any model "
     "loads (models load on their first request; /v1/models says which are loaded)")
async def health() -> dict[str, str]:
    return {"status": "ok"}


def _model_row(model: ServedModel) -> dict[str, Any]:
    return {"id": model.model_id, "object": "model", "created": model.created, "owned_by": "ninfer",
            "meta": _model_meta(model)}


def _model_meta(model: ServedModel) -> dict[str, Any]:
    info, stats = model.engine.info, model.engine.stats()
    return {"arch": info.arch, "n_ctx": info.max_context, "n_ctx_train": info.max_context,
            "n_vocab": info.vocab_size, "n_layer": info.num_layers, "n_embd": info.hidden_size,
            "size": info.artifact_bytes, "kv_dtype": info.kv_dtype, "max_concurrency": info.max_concurrency,
            "resident_bytes": stats.resident_bytes}


@get("/v1/models", summary="The served models (OpenAI shape)")
async def list_models(router: RouterDependency) -> dict[str, Any]:
    return {"object": "list", "data": model_rows(router, _model_row)}  # every configured model, with its status


@get("/models", summary="The served models (llama.cpp shape, with engine metadata)")
async def list_models_llama(router: RouterDependency) -> dict[str, Any]:
    models = []
    for m in router.models:
        info = m.engine.info
        models.append({
            "name": m.model_id, "model": m.model_id, "type": "model", "path": info.path,
            "capabilities": ["completion", "chat"], "modalities": {mod: True for mod in info.modalities},
            "context": info.max_context, "encoding": info.encoding,
            "memory": {"artifact_bytes": info.artifact_bytes, "resident_bytes": m.engine.stats().resident_bytes},
        })
    return {"models": models, "object": "list", "data": [_model_row(m) for m in router.models]}


class TokenizeRequest(msgspec.Struct, kw_only=True):
    content: str
    model: str | None = None
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    tokens: list[TokenId]
    model: str | None = None


class ApplyTemplateRequest(msgspec.Struct, kw_only=True):
    messages: ChatMessages
    model: str | None = None
    tools: list[ChatTool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


@post("/tokenize", status_code=200, summary="Text -> token ids (llama.cpp body)")
async def tokenize(data: JSONBody[TokenizeRequest], lease: LeaseDependency) -> dict[str, Any]:
    frontend = lease.served.engine.frontend
    ids = await asyncio.to_thread(frontend.encode, data.content)  # a long text: off the event loop
    if data.add_special and frontend.bos_token_id is not None:
        ids = [frontend.bos_token_id, *ids]
    if not data.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": i, "piece": frontend.decode([i], skip_special_tokens=False)} for i in ids]}


@post("/detokenize", status_code=200, summary="Token ids -> text (llama.cpp body)")
async def detokenize(data: JSONBody[DetokenizeRequest], lease: LeaseDependency) -> dict[str, Any]:
    engine = lease.served.engine
    bad = [t for t in data.tokens if t >= engine.info.vocab_size]
    if bad:
        raise InvalidRequestError(f"token id {bad[0]} is outside the vocabulary of {engine.info.vocab_size}",
                                  param="tokens")
    return {"content": engine.frontend.decode(data.tokens, skip_special_tokens=False)}


@post("/apply-template", status_code=200, summary="Chat messages -> the prompt text the model would see")
async def apply_template(data: JSONBody[ApplyTemplateRequest], lease: LeaseDependency) -> dict[str, Any]:
    kwargs = dict(data.chat_template_kwargs or {})
    thinking = kwargs.pop("enable_thinking", None)
    messages = await asyncio.to_thread(template_messages, data.messages)  # every message: off the event loop
    chat = ChatPrompt(messages, tools=chat_form_tools(data.tools)[0] if data.tools else None,
                      add_generation_prompt=data.add_generation_prompt,
                      enable_thinking=thinking if isinstance(thinking, bool) else None,
                      chat_template_kwargs=kwargs or None)
    return {"prompt": (await prepare_prompt(lease.served, chat)).text}


@get("/metrics", summary="Prometheus metrics", media_type=CONTENT_TYPE)
async def metrics(router: RouterDependency) -> Response[bytes]:
    return Response(router.metrics.render(), media_type=CONTENT_TYPE)


route_handlers = [health, list_models, list_models_llama, tokenize, detokenize, apply_template, metrics]
