"""Runs checked decision questions on an engine: renders them (prompt.py), turns each label into its candidate
token, submits the decision job (the context prefilled once, forked per question) and reads the answers
(readout.py). A two-token choice is its own job: the letter read after its suffix, then the digit read after the
suffix and each letter."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ninfer import errors
from ninfer.decisions.contract import DecisionLimits, Question, TooLargeError
from ninfer.decisions.prompt import (
    CODE_DIGITS,
    CODE_LETTERS,
    ChatFrontend,
    Labels,
    RenderedDecision,
    labels_for,
    question_text,
    render_decision,
)
from ninfer.decisions.readout import chain_codes, softmax


class DecisionEngine(Protocol):
    frontend: Any
    info: Any

    async def decide(self, context: Sequence[int], questions: Sequence[tuple[Sequence[int], Sequence[int]]]
                     ) -> list[list[float]]: ...


class LabelTokenError(errors.EngineError):
    """A label is not one token of this model's tokenizer: the readout cannot be exact."""


def label_token(frontend: ChatFrontend, label: str) -> int:
    ids = frontend.encode(label)
    if len(ids) != 1:
        raise LabelTokenError(f"the answer label {label!r} is {len(ids)} tokens for this model's tokenizer, not one")
    return ids[0]


@dataclass(frozen=True)
class _Plan:
    """Where a question's reads sit: engine job `job`, read `first` (the label, or a code's letter) and, for
    two-token codes, per letter index the read of the digit after it."""

    job: int
    first: int
    digits: dict[int, int]


@dataclass
class _Job:
    context: list[int]
    reads: list[tuple[list[int], list[int]]]


def plan_reads(frontend: ChatFrontend, rendered: RenderedDecision) -> tuple[list[_Job], list[_Plan]]:
    """The engine jobs of a request: one for every single-token question (the shared context forked per question),
    and one per two-token question, whose context is the shared context and its suffix but the last token: its
    letter read and every digit read then fork after the whole question instead of prefilling it 27 times."""
    shared = _Job(rendered.context, [])
    jobs, plans = [shared], []
    digit_ids = [label_token(frontend, d) for d in CODE_DIGITS]
    for rq in rendered.questions:
        labels = rq.labels
        if not labels.two_token:
            shared.reads.append((rq.suffix, [label_token(frontend, lab) for lab in labels.labels]))
            plans.append(_Plan(0, len(shared.reads) - 1, {}))
            continue
        letters = sorted({CODE_LETTERS.index(lab[0]) for lab in labels.labels})
        letter_ids = [label_token(frontend, CODE_LETTERS[i]) for i in range(letters[-1] + 1)]
        last = rq.suffix[-1]
        job = _Job(rendered.context + rq.suffix[:-1], [([last], letter_ids)])
        digits = {}
        for i in letters:
            job.reads.append(([last, letter_ids[i]], digit_ids))
            digits[i] = len(job.reads) - 1
        jobs.append(job)
        plans.append(_Plan(len(jobs) - 1, 0, digits))
    return jobs, plans


async def _answers(engine: DecisionEngine, job: _Job) -> list[list[float]]:
    return await engine.decide(job.context, job.reads) if job.reads else []


def label_logprobs(labels: Labels, plan: _Plan, lps: list[list[list[float]]]) -> list[float]:
    reads = lps[plan.job]
    if not labels.two_token:
        return reads[plan.first]
    return chain_codes(reads[plan.first], {i: reads[r] for i, r in plan.digits.items()}, len(labels.labels))


async def run_questions(engine: DecisionEngine, shared: list[dict[str, Any]], questions: list[tuple[str, Labels]],
                        limits: DecisionLimits, temperature: float = 1.0) -> tuple[list[list[float]], int]:
    """Each question's label probabilities (its labels' order) and the request's input tokens."""
    frontend = engine.frontend
    rendered = await asyncio.to_thread(render_decision, frontend, shared, questions, limits.max_total_tokens)
    if rendered.input_tokens > limits.max_total_tokens:
        raise TooLargeError(f"the rendered questions take {rendered.input_tokens} tokens; the decision budget is "
                            f"{limits.max_total_tokens}")
    longest = len(rendered.context) + max(len(q.suffix) for q in rendered.questions) + 1  # + a code's letter
    if longest > engine.info.max_context:
        raise errors.CapacityError(f"a question's prompt has {longest} tokens; the context is "
                                   f"{engine.info.max_context}")
    jobs, plans = plan_reads(frontend, rendered)
    async with asyncio.TaskGroup() as group:  # one failing cancels the others (their rows are freed at once)
        tasks = [group.create_task(_answers(engine, job)) for job in jobs]
    lps = [task.result() for task in tasks]
    probs = [softmax(label_logprobs(rq.labels, plan, lps), temperature)
             for rq, plan in zip(rendered.questions, plans, strict=True)]
    return probs, rendered.input_tokens


def typed_questions(questions: list[Question]) -> list[tuple[str, Labels]]:
    out = []
    for q in questions:
        labels = labels_for(q)
        out.append((question_text(q, labels), labels))
    return out
