"""The request body of `/v1/decisions` and `/v1/systemone`, checked: every violation of one body at once, as
pydantic-style entries `{type, loc, msg, input}` (TypeSafe's 422 `detail`), so both error shapes come from one list.

Rules (docs/decisions.md): exactly one of `state` (a non-empty string, object or array) or `messages` (a non-empty
array of chat messages); `questions` an object of 1..max_questions entries, in request order, with non-empty ids;
a question has `type` noul|choice|score, optional `instructions` (string, object, array or null) and `criteria`:
noul an object with only `true`/`false`, choice an object of 1..255 options, score an array of 2..50 levels.
Duplicate keys anywhere in the raw JSON, unknown keys inside a question, a non-string `model` and a temperature
that is not a finite number > 0 are refused; unknown top-level keys are ignored (JevBench adds its own).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

QUESTION_TYPES = ("noul", "choice", "score")
QUESTION_KEYS = frozenset({"type", "instructions", "criteria"})


@dataclass(frozen=True)
class DecisionLimits:
    """Bounds of one request (413 beyond them); the server's flags set them (docs/decisions.md)."""

    max_questions: int = 256
    max_options: int = 255
    min_levels: int = 2
    max_levels: int = 50
    max_total_tokens: int = 64_000  # the rendered prompts together: shared context + every question's suffix


@dataclass(frozen=True)
class Question:
    id: str
    type: str
    instructions: Any  # None, a string, or a JSON object / array
    criteria: Any  # noul: {"true"?, "false"?} or None; choice: {key: description}; score: [level, ...]


@dataclass(frozen=True)
class DecisionRequest:
    state: Any  # a string or a JSON object / array; None with messages
    messages: list[dict[str, Any]] | None
    questions: list[Question]
    model: str | None = None
    temperature: float = 1.0


@dataclass
class ContractError(Exception):
    """The body breaks the contract: `status` 400 (not JSON) or 422 (a field), `problems` the entries."""

    status: int
    problems: list[dict[str, Any]] = field(default_factory=list)

    def __str__(self) -> str:
        return "; ".join(f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in self.problems)


class TooLargeError(Exception):
    """Over a DecisionLimits bound: 413."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def load_json(body: bytes) -> Any:
    """The body as JSON, refusing duplicate keys (a second `A` option would silently replace the first)."""
    if not body.strip():
        raise ContractError(400, [{"type": "json_invalid", "loc": ["body"], "msg": "the body is empty",
                                   "input": None}])
    try:
        return json.loads(body, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as exc:
        kind = "duplicate_key" if "duplicate key" in str(exc) else "json_invalid"
        status = 422 if kind == "duplicate_key" else 400
        raise ContractError(status, [{"type": kind, "loc": ["body"], "msg": str(exc), "input": None}]) from None


class _Problems:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, kind: str, loc: list[Any], msg: str, value: Any = None) -> None:
        self.items.append({"type": kind, "loc": ["body", *loc], "msg": msg, "input": value})


def _is_content(value: Any) -> bool:
    return isinstance(value, (str, dict, list))


def _check_question(qid: str, q: Any, limits: DecisionLimits, problems: _Problems) -> Question | None:
    loc = ["questions", qid]
    if qid == "":
        problems.add("string_too_short", loc, "a question id must not be empty", qid)
    if not isinstance(q, dict):
        problems.add("dict_type", loc, "a question must be an object", q)
        return None
    for key in q:
        if key not in QUESTION_KEYS:
            problems.add("extra_forbidden", [*loc, key], f"unknown key {key!r} in a question", q[key])
    qtype = q.get("type")
    if qtype not in QUESTION_TYPES:
        kind = "union_tag_not_found" if "type" not in q else "union_tag_invalid"
        problems.add(kind, [*loc, "type"], f"type must be one of {', '.join(QUESTION_TYPES)}", qtype)
        return None
    instructions = q.get("instructions")
    if instructions is not None and not _is_content(instructions):
        problems.add("content_type", [*loc, "instructions"], "instructions must be a string, object, array or null",
                     instructions)
    criteria = q.get("criteria")
    count_problem: tuple[str, str] | None = None  # (kind, message)
    if qtype == "noul":
        if criteria is not None and not isinstance(criteria, dict):
            problems.add("dict_type", [*loc, "criteria"], "noul criteria must be an object", criteria)
        elif criteria:
            for key in criteria:
                if key not in ("true", "false"):
                    problems.add("extra_forbidden", [*loc, "criteria", key], "noul criteria take only true and false",
                                 criteria[key])
    elif qtype == "choice":
        if not isinstance(criteria, dict):
            problems.add("dict_type", [*loc, "criteria"], "choice criteria must be an object of options", criteria)
        elif not 1 <= len(criteria) <= limits.max_options:
            count_problem = ("too_short" if not criteria else "too_long",
                             f"a choice needs 1..{limits.max_options} options, got {len(criteria)}")
        else:
            for key, desc in criteria.items():
                if key == "":
                    problems.add("string_too_short", [*loc, "criteria", key], "an option key must not be empty", key)
                if desc is not None and not _is_content(desc):
                    problems.add("content_type", [*loc, "criteria", key],
                                 "an option description must be a string, object, array or null", desc)
    else:
        if not isinstance(criteria, list):
            problems.add("list_type", [*loc, "criteria"], "score criteria must be an array of levels", criteria)
        elif not limits.min_levels <= len(criteria) <= limits.max_levels:
            count_problem = ("too_short" if len(criteria) < limits.min_levels else "too_long",
                             f"a score needs {limits.min_levels}..{limits.max_levels} levels, got {len(criteria)}")
        else:
            for i, level in enumerate(criteria):
                if not _is_content(level):
                    problems.add("content_type", [*loc, "criteria", i], "a level must be a string, object or array",
                                 level)
    if count_problem:
        problems.add(count_problem[0], [*loc, "criteria"], count_problem[1], None)
    return Question(qid, qtype, instructions, criteria)


def parse_request(data: Any, limits: DecisionLimits) -> DecisionRequest:
    """A checked DecisionRequest, or ContractError (422) listing every problem; TooLargeError past max_questions."""
    problems = _Problems()
    if not isinstance(data, dict):
        raise ContractError(422, [{"type": "dict_type", "loc": ["body"], "msg": "the body must be a JSON object",
                                   "input": data}])
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        problems.add("string_type", ["model"], "model must be a string", model)
    state, messages = data.get("state"), data.get("messages")
    if isinstance(state, list) and state and all(isinstance(m, dict) and "role" in m for m in state):
        state, messages = (None, state) if messages is None else (state, messages)  # llama.cpp's form
    if (state is None) == (messages is None):
        problems.add("missing" if state is None else "value_error", ["state"],
                     "send exactly one of state or messages", None)
    elif state is not None and (not _is_content(state) or state in ("", {}, [])):
        problems.add("content_type", ["state"], "state must be a non-empty string, object or array", state)
    elif messages is not None and (not isinstance(messages, list) or not messages
                                   or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                              for m in messages)):
        problems.add("list_type", ["messages"], "messages must be a non-empty array of chat messages", messages)
    temperature = data.get("temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature <= 0:
        problems.add("greater_than", ["temperature"], "temperature must be a finite number > 0", temperature)
        temperature = 1.0
    raw = data.get("questions")
    questions: list[Question] = []
    if not isinstance(raw, dict) or not raw:
        problems.add("missing" if raw is None else "too_short", ["questions"],
                     "questions must be an object with at least one question", raw)
    elif len(raw) > limits.max_questions:
        raise TooLargeError(f"{len(raw)} questions; at most {limits.max_questions} per request")
    else:
        for qid, q in raw.items():
            checked = _check_question(qid, q, limits, problems)
            if checked is not None:
                questions.append(checked)
    if problems.items:
        raise ContractError(422, problems.items)
    return DecisionRequest(state, messages, questions, model, float(temperature))
