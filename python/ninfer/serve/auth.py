"""API keys: `Authorization: Bearer KEY` (OpenAI SDKs) or `x-api-key: KEY` (Anthropic SDKs).

Keys come from a file, one per line (blank lines and `#` comments ignored). Every request to a guarded route must
carry one of them, compared in constant time against each key so the timing tells nothing about near misses. Routes
marked `opt={"public": True}` (health checks, which load balancers probe without credentials) are open. With no
key file the server is open, as llama.cpp is without `--api-key`.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler

from ninfer.errors import NinferError


class ApiKeyFileError(NinferError):
    """The API key file is missing, unreadable or holds no key."""


def read_api_keys(path: str | Path) -> frozenset[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ApiKeyFileError(f"cannot read the API key file {path}: {exc}") from exc
    keys = frozenset(line.strip() for line in lines if line.strip() and not line.strip().startswith("#"))
    if not keys:
        raise ApiKeyFileError(f"the API key file {path} holds no key")
    return keys


def presented_key(connection: ASGIConnection) -> str | None:
    authorization = connection.headers.get("authorization")
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return connection.headers.get("x-api-key") or None


def key_matches(presented: str, keys: frozenset[str]) -> bool:
    # Compare against every key (no early exit), as bytes so non-ASCII input cannot raise.
    given = presented.encode("utf-8", "surrogatepass")
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key.encode("utf-8"))
    return found


def refusal(connection: ASGIConnection, handler_opt: dict | None) -> str | None:
    """Why this request may not reach its route (None: it may). The model gate asks too, so that a request without
    a valid key never loads or swaps a model."""
    keys: frozenset[str] = connection.app.state.api_keys
    if not keys or (handler_opt or {}).get("public"):
        return None
    presented = presented_key(connection)
    if presented is None:
        return "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
    return None if key_matches(presented, keys) else "invalid API key"


async def api_key_guard(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    # async although it never waits: Litestar runs a sync guard in a worker thread, a thread hop per request (a few
    # ms of a loaded machine's time to first token) for a few comparisons.
    reason = refusal(connection, handler.opt)
    if reason:
        raise NotAuthorizedException(reason)
