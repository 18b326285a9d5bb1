"""A request header read from the ASGI scope, for the middleware that runs before Litestar builds a Request."""

from __future__ import annotations

from typing import Any


def scope_header(scope: Any, name: bytes) -> str | None:
    """The first value of header `name` (lower case), or None."""
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None
