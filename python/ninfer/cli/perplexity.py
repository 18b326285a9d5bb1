"""`ninfer perplexity [MODEL] --text-file F [--context N] [--json]`: exp(mean negative log-likelihood) of a text,
scored in consecutive windows of N tokens (each window starts fresh, its first token is context only)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from tqdm import tqdm

from ninfer.cli.generate import add_model_arguments, open_engine
from ninfer.cli.main import CliError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--text-file", required=True, metavar="F", help="UTF-8 text to score")
    parser.add_argument("--context", type=int, default=512, metavar="N", help="tokens per window (default 512)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def windows(token_ids: list[int], context: int) -> list[list[int]]:
    """Consecutive windows of `context` tokens; a last window shorter than 2 tokens predicts nothing, so it is dropped."""
    return [w for w in (token_ids[i:i + context] for i in range(0, len(token_ids), context)) if len(w) >= 2]


def run(args: argparse.Namespace) -> int:
    if args.context < 2:
        raise CliError(f"--context must be >= 2, got {args.context}")
    try:
        text = Path(args.text_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read --text-file: {exc}") from exc
    args.max_context = max(args.max_context, args.context)
    with open_engine(args) as engine:
        token_ids = engine.frontend.encode(text)
        chunks = windows(token_ids, args.context)
        if not chunks:
            raise CliError(f"{args.text_file} has fewer than 2 tokens: nothing to score")
        nll, count = 0.0, 0
        for chunk in tqdm(chunks, desc="scoring", unit="window", file=sys.stderr, disable=not sys.stderr.isatty()):
            logprobs = engine.score_sync(chunk)
            nll -= sum(logprobs)
            count += len(logprobs)
    result = {"perplexity": math.exp(nll / count), "nll_per_token": nll / count, "scored_tokens": count,
              "windows": len(chunks), "context": args.context}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"perplexity {result['perplexity']:.4f} over {count} tokens ({len(chunks)} windows of "
              f"{args.context})")
    return 0
