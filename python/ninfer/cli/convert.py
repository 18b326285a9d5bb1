"""`ninfer convert SRC OUT --recipe NAME|FILE [--template NAME] [--mtp-head FILE] [--draft-vocab N]`: argument parsing
only (the work is in ninfer.artifact.convert)."""

from __future__ import annotations

import argparse
import logging

from ninfer.artifact.convert import AUTO_TEMPLATE, convert
from ninfer.artifact.recipes import BUILTIN_RECIPES
from ninfer.cli.main import CliError
from ninfer.errors import NinferError
from ninfer.frontend.templates import TEMPLATE_NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="a Hugging Face model folder (config.json + *.safetensors: bf16 / fp16 / fp32, or "
                                    "pre-quantised block FP8, GPTQ, AWQ, compressed-tensors int4 or NVFP4, ModelOpt "
                                    "NVFP4; see docs/conversion.md) or a .gguf file")
    parser.add_argument("out", help="the .ninfer file to write")
    parser.add_argument("--recipe", default="bf16",
                        help=f"built-in recipe ({', '.join(BUILTIN_RECIPES)}) or a JSON recipe file (default bf16)")
    parser.add_argument("--template", default=AUTO_TEMPLATE, choices=(AUTO_TEMPLATE, *TEMPLATE_NAMES),
                        help="chat template: 'auto' keeps the checkpoint's own, else qwen3_5 for the Qwen3.5 "
                             "family and chatml for plain models; a name forces that project template")
    parser.add_argument("--mtp-head", metavar="FILE", default=None,
                        help="attach this MTP draft head (safetensors, logical names; float, or int8 with "
                             "per-row scales: docs/conversion.md) to a model without one, for --spec mtp "
                             "(docs/speculative-decoding.md)")
    parser.add_argument("--draft-vocab", metavar="N", type=int, default=None,
                        help="the MTP head's drafts score only N lm-head rows (the N most frequent tokens by the "
                             "tokenizer's merge order, end-of-sequence tokens kept); verification uses the full "
                             "head, so output is unchanged (docs/speculative-decoding.md)")
    parser.add_argument("--no-progress", action="store_true", help="do not show a progress bar")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="ninfer: %(message)s")
    try:
        out = convert(args.src, args.out, recipe=args.recipe, template=args.template,
                      progress=not args.no_progress, mtp_head=args.mtp_head, draft_vocab=args.draft_vocab)
    except NinferError as exc:
        raise CliError(str(exc)) from exc
    print(f"wrote {out}")
    return 0
