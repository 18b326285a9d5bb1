"""The project's own chat templates (Jinja), stored into artifacts as frontend resources.

`load_chat_template(name)` returns one self-contained template text. The Qwen3.5 / 3.6 / 3.8 templates share one
body (`_qwen3_5_family.jinja`); each version's file only sets that body's switches, and the loader joins the two so
the artifact carries a single template that needs no include. `template_environment()` is the Jinja environment
the templates are written for (HF-compatible: sandboxed, `raise_exception`, `tojson` without HTML escaping).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ninfer.errors import EngineError

QWEN_FAMILY_TEMPLATES = ("qwen3_5", "qwen3_6", "qwen3_8")
TEMPLATE_NAMES = (*QWEN_FAMILY_TEMPLATES, "chatml")
_FAMILY_BODY = "_qwen3_5_family.jinja"


def _read(filename: str) -> str:
    return resources.files(__package__).joinpath(filename).read_text(encoding="utf-8")


def load_chat_template(name: str) -> str:
    """The full text of the project template `name` (one of TEMPLATE_NAMES)."""
    if name not in TEMPLATE_NAMES:
        raise KeyError(f"unknown chat template {name!r}; known: {', '.join(TEMPLATE_NAMES)}")
    text = _read(f"{name}.jinja")
    if name in QWEN_FAMILY_TEMPLATES:
        text += _read(_FAMILY_BODY)
    return text


def _raise_exception(message: str) -> None:
    # A template refuses a conversation it cannot render: a bad request, hence EngineError.
    raise EngineError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; chat templates need the plain JSON text.
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def template_environment() -> ImmutableSandboxedEnvironment:
    """A sandboxed Jinja environment with the globals and filters HF chat templates expect."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = _raise_exception
    env.filters["tojson"] = _tojson
    return env
