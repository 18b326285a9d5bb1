"""Each question's prompt, frozen (docs/decisions.md): the shared context is a system turn holding the state (or
that system turn followed by the `messages` history), each question one user turn, then the assistant turn opened
with thinking disabled; the answer is read at the assistant's first token, over one candidate token per label.

Rendering rules:
- a string state (or instruction, option, level) goes in verbatim; an object or array as compact JSON
  (`json.dumps(separators=(",", ":"), ensure_ascii=False)`, keys in the order the request sent them);
- question ids never reach the model; options and levels keep the request's order;
- labels: noul `Yes`/`No`; score `0`..`9` up to 10 levels, else `A`..`Z`, `a`..`x` (50); choice the keys
  themselves when every key is one printable ASCII character, else `A`..`Z`, `a`..`z`, `0`..`9` up to 62 options,
  beyond that two-token codes `A0`..`Z9` (letter, then digit: two reads, chained).
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from typing import Any, Protocol

from ninfer.decisions.contract import Question, TooLargeError

SYSTEM_PREFIX = "You are an evaluation assistant. State to evaluate:\n"
SYSTEM_FOR_MESSAGES = "You are an evaluation assistant. Evaluate the conversation that follows."
DEFAULT_INSTRUCTIONS = {
    "noul": "Based on the state, is the answer Yes or No?",
    "choice": "Which option best fits the state?",
    "score": "Which rating level best fits the state?",
}
SINGLE_LABELS = string.ascii_uppercase + string.ascii_lowercase + string.digits  # 62
SCORE_LETTERS = (string.ascii_uppercase + string.ascii_lowercase)[:50]
CODE_LETTERS = string.ascii_uppercase
CODE_DIGITS = string.digits


class ChatFrontend(Protocol):
    def render(self, messages: Any, **options: Any) -> Any: ...
    def encode(self, text: str) -> list[int]: ...


def content_text(value: Any) -> str:
    """A content value as the model reads it: a string verbatim, anything else compact JSON in source order."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Labels:
    """What a question's answer is read over: one label per option (`codes` two-character labels, read letter
    then digit)."""

    labels: list[str]
    two_token: bool = False


def labels_for(q: Question) -> Labels:
    if q.type == "noul":
        return Labels(["Yes", "No"])
    if q.type == "score":
        n = len(q.criteria)
        return Labels([str(i) for i in range(n)] if n <= 10 else list(SCORE_LETTERS[:n]))
    keys = list(q.criteria)
    if all(len(k) == 1 and k in string.printable and not k.isspace() for k in keys):
        return Labels(keys)
    if len(keys) <= len(SINGLE_LABELS):
        return Labels(list(SINGLE_LABELS[:len(keys)]))
    return Labels([CODE_LETTERS[i // 10] + CODE_DIGITS[i % 10] for i in range(len(keys))], two_token=True)


def question_text(q: Question, labels: Labels) -> str:
    instructions = content_text(q.instructions) if q.instructions is not None else DEFAULT_INSTRUCTIONS[q.type]
    lines = [f"Question: {instructions}"]
    if q.type == "noul":
        criteria = q.criteria or {}
        if criteria.get("true") is not None or criteria.get("false") is not None:
            lines.append("Criteria:")
            if criteria.get("true") is not None:
                lines.append(f"- Yes: {content_text(criteria['true'])}")
            if criteria.get("false") is not None:
                lines.append(f"- No: {content_text(criteria['false'])}")
        lines.append("Answer with only Yes or No:")
    elif q.type == "choice":
        lines.append("Options:")
        for label, (key, desc) in zip(labels.labels, q.criteria.items(), strict=True):
            head = label if label == key else f"{label} [{key}]"
            lines.append(f"- {head}: {content_text(desc)}" if desc is not None else f"- {head}")
        what = "option code" if labels.two_token else "option letter or digit" if len(labels.labels) > 26 \
            else "option letter"
        lines.append(f"Select the best option. Answer with only the {what}:")
    else:
        lines.append("Rating levels:")
        for label, level in zip(labels.labels, q.criteria, strict=True):
            lines.append(f"- {label}: {content_text(level)}")
        what = "level number" if len(labels.labels) <= 10 else "level letter"
        lines.append(f"Select the rating level that best applies. Answer with only the {what}:")
    return "\n".join(lines)


def context_messages(state: Any, messages: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if messages is not None:
        return [{"role": "system", "content": SYSTEM_FOR_MESSAGES}, *messages]
    return [{"role": "system", "content": SYSTEM_PREFIX + content_text(state)}]


def _render(frontend: ChatFrontend, messages: list[dict[str, Any]], generation: bool) -> str:
    return frontend.render(messages, add_generation_prompt=generation, enable_thinking=False).text


@dataclass(frozen=True)
class RenderedQuestion:
    suffix: list[int]  # tokens after the shared context, up to the answer position
    labels: Labels


@dataclass(frozen=True)
class RenderedDecision:
    context: list[int]
    questions: list[RenderedQuestion]

    @property
    def input_tokens(self) -> int:
        """The shared context once plus each question's own suffix (independent of any cache)."""
        return len(self.context) + sum(len(q.suffix) for q in self.questions)


# A long context is held to the decision budget before it is tokenized whole, a piece at a time: one encode of a
# 9.4 MiB state (5 million tokens) took ~20 s holding the GIL, so every other request waited.
BUDGET_PIECE_CHARS = 1 << 16
# Tokens a cut inside a word may add (the pieces' count less this per piece stays at or below the whole text's).
CUT_SLACK_TOKENS = 8


def more_tokens_than(frontend: ChatFrontend, text: str, limit: int) -> bool:
    """Whether `text` has more than `limit` tokens for certain, told by encoding it a piece of BUDGET_PIECE_CHARS
    characters at a time until the pieces' count (each less CUT_SLACK_TOKENS) passes `limit`; False for a text of
    one piece (its whole encode is cheap) or one within the limit."""
    if len(text) <= BUDGET_PIECE_CHARS:
        return False
    counted = 0
    for at in range(0, len(text), BUDGET_PIECE_CHARS):
        counted += len(frontend.encode(text[at:at + BUDGET_PIECE_CHARS])) - CUT_SLACK_TOKENS
        if counted > limit:
            return True
    return False


def render_decision(frontend: ChatFrontend, shared: list[dict[str, Any]],
                    questions: list[tuple[str, Labels]], max_tokens: int | None = None) -> RenderedDecision:
    """The shared context's tokens and each question's suffix, for `questions` as (user text, labels). The
    context is the rendered shared turns on their own, so it is the same tokens whatever the questions are (a
    question alone and inside a batch of fifty fork the same state); each question is tokenized whole and must
    begin with those tokens. `max_tokens`: a context certainly longer is refused (TooLargeError) before it is
    tokenized whole (more_tokens_than)."""
    text = _render(frontend, shared, False)
    if max_tokens is not None and more_tokens_than(frontend, text, max_tokens):
        raise TooLargeError(f"the shared context takes more than {max_tokens} tokens, the decision budget")
    context = frontend.encode(text)
    out = []
    for text, labels in questions:
        ids = frontend.encode(_render(frontend, [*shared, {"role": "user", "content": text}], True))
        if ids[:len(context)] != context or len(ids) <= len(context):
            raise ValueError("the chat template's rendering of the shared context is not a prefix of the question's")
        out.append(RenderedQuestion(ids[len(context):], labels))
    return RenderedDecision(context, out)
