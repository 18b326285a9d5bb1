"""Writes bench/decisions/ninfer-suite.jsonl: ninfer's own decision tasks in the public JevBench task format
(`id, state, question{type, instructions, criteria}, labels, expected, split, group, provenance`), covering all
three types, 1..255 options and 2..50 levels, every task in a paraphrase pair (the same decision asked two ways,
sharing a `group`). Deterministic: run it again and the file is the same.

    python bench/decisions_suite.py [--out bench/decisions/ninfer-suite.jsonl]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "decisions" / "ninfer-suite.jsonl"


def noul(state: Any, instructions: str, expected: bool, criteria: dict | None = None) -> dict[str, Any]:
    q = {"type": "noul", "instructions": instructions}
    if criteria:
        q["criteria"] = criteria
    return {"state": state, "question": q, "labels": ["no", "yes"], "expected": "yes" if expected else "no"}


def choice(state: Any, instructions: str, options: dict[str, Any], expected: str) -> dict[str, Any]:
    assert expected in options
    return {"state": state, "question": {"type": "choice", "instructions": instructions, "criteria": options},
            "labels": list(options), "expected": expected}


def score(state: Any, instructions: str, levels: list[Any], expected: int) -> dict[str, Any]:
    return {"state": state, "question": {"type": "score", "instructions": instructions, "criteria": levels},
            "labels": [str(i) for i in range(len(levels))], "expected": expected}


ROUTES = {"billing": "payments, charges, refunds, invoices", "technical": "bugs, crashes, errors, login problems",
          "shipping": "deliveries, tracking, lost parcels"}
COLORS = [f"c{i:03d}" for i in range(255)]


def pairs() -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(family, name, task, its paraphrase)."""
    return [
        ("arithmetic", "even", noul("The number is 14.", "Is the number even?", True),
         noul({"number": 14}, "Is the number divisible by two?", True)),
        ("arithmetic", "odd", noul("The number is 9.", "Is the number even?", False),
         noul({"number": 9}, "Is the number divisible by two?", False)),
        ("adequacy", "answer", noul({"question": "What is the capital of France?", "answer": "Paris"},
                                    "Does the answer correctly answer the question?", True,
                                    {"true": "the answer is correct", "false": "the answer is wrong"}),
         noul("Q: What is the capital of France? A: Paris", "Is this answer right?", True)),
        ("adequacy", "wrong", noul({"question": "What is the capital of France?", "answer": "Berlin"},
                                   "Does the answer correctly answer the question?", False),
         noul("Q: What is the capital of France? A: Berlin", "Is this answer right?", False)),
        ("routing", "refund", choice("Ticket: I was charged twice for my order, please refund one payment.",
                                     "Which team should handle this ticket?", ROUTES, "billing"),
         choice({"ticket": "I was charged twice for my order, please refund one payment."},
                "Route the ticket to a team.", ROUTES, "billing")),
        ("routing", "crash", choice("Ticket: The app crashes with an error every time I log in.",
                                    "Which team should handle this ticket?", ROUTES, "technical"),
         choice({"ticket": "The app crashes with an error every time I log in."}, "Route the ticket to a team.",
                ROUTES, "technical")),
        ("routing", "single", choice("Ticket: where is my parcel?", "Which team should handle this ticket?",
                                     {"shipping": "deliveries"}, "shipping"),
         choice({"ticket": "where is my parcel?"}, "Route the ticket.", {"shipping": None}, "shipping")),
        ("extraction", "color-255", choice("The paint code on the label is c137.", "Which paint code is on the label?",
                                           {c: f"paint code {c}" for c in COLORS}, "c137"),
         choice({"label": "c137"}, "Pick the code printed on the label.", {c: None for c in COLORS}, "c137")),
        ("extraction", "letter-keys", choice("The grade on the report card is B.", "Which grade is on the card?",
                                             {"A": "excellent", "B": "good", "C": "fair", "D": "poor"}, "B"),
         choice({"grade": "B"}, "What grade was given?", {"A": None, "B": None, "C": None, "D": None}, "B")),
        ("ordinal", "binary", score("The light is on.", "How bright is the room?", ["dark", "lit"], 1),
         score({"light": "on"}, "Rate the room's brightness.", ["dark", "lit"], 1)),
        ("ordinal", "five", score("The customer wrote: 'Absolutely terrible, never again.'",
                                  "Rate the customer's satisfaction.",
                                  ["very unhappy", "unhappy", "neutral", "happy", "very happy"], 0),
         score({"review": "Absolutely terrible, never again."}, "How satisfied is the reviewer?",
               ["very unhappy", "unhappy", "neutral", "happy", "very happy"], 0)),
        ("ordinal", "eleven", score("The thermometer shows 7 degrees.", "Which level matches the temperature?",
                                    [f"{i} degrees" for i in range(11)], 7),
         score({"temperature_degrees": 7}, "Rate the temperature.", [f"{i} degrees" for i in range(11)], 7)),
        ("ordinal", "fifty", score("The meter reads 37.", "Which level matches the reading?",
                                   [f"reading {i}" for i in range(50)], 37),
         score({"meter": 37}, "Pick the level of the meter's reading.", [f"reading {i}" for i in range(50)], 37)),
    ]


def tasks() -> list[dict[str, Any]]:
    out = []
    for family, name, first, second in pairs():
        for variant, task in (("a", first), ("b", second)):
            out.append({"id": f"ninfer-{family}-{name}-{variant}", **task, "split": "public",
                        "group": f"ninfer-{family}-{name}", "provenance": {"source": "bench/decisions_suite.py",
                                                                           "family": family}})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for task in tasks():
            f.write(json.dumps(task, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(tasks())} tasks")


if __name__ == "__main__":
    main()
