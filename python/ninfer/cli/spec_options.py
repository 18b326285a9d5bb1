"""The speculative decoding options `ninfer` and `ninfer-serve` share: `--spec mtp --draft-tokens K`."""

from __future__ import annotations

import argparse
from typing import Any

from ninfer.cli.main import CliError
from ninfer.engine import MAX_DRAFT_TOKENS

# "draft" (a separate draft model) is a later issue's: parsed so that configs naming it fail clearly.
SPEC_METHODS = ("none", "mtp", "draft")
DEFAULT_DRAFT_TOKENS = 3


def add_spec_arguments(parser: argparse.ArgumentParser | Any) -> None:
    parser.add_argument(
        "--spec", choices=SPEC_METHODS, default="none",
        help="speculative decoding: mtp = the model's MTP head drafts tokens the model then verifies in one pass; "
        "lossless (the same tokens as without; docs/speculative-decoding.md); CPU and CUDA backends "
        "(default none)",
    )
    parser.add_argument(
        "--draft-tokens", type=int, metavar="K",
        help=f"drafts per round with --spec mtp, 1..{MAX_DRAFT_TOKENS} (default {DEFAULT_DRAFT_TOKENS})",
    )


def check_spec_arguments(args: argparse.Namespace) -> None:
    if args.spec == "draft":
        raise CliError("--spec draft: a separate draft model is not implemented yet in this build (use --spec mtp)")
    if args.draft_tokens is not None:
        if args.spec != "mtp":
            raise CliError("--draft-tokens needs --spec mtp")
        if not 1 <= args.draft_tokens <= MAX_DRAFT_TOKENS:
            raise CliError(f"--draft-tokens must be in 1..{MAX_DRAFT_TOKENS}, got {args.draft_tokens}")


def spec_options(args: argparse.Namespace) -> dict[str, Any]:
    """EngineOptions fields for the checked arguments."""
    if args.spec != "mtp":
        return {}
    return {"spec": "mtp", "draft_tokens": args.draft_tokens or DEFAULT_DRAFT_TOKENS}
