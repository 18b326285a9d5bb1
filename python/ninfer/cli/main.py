"""`ninfer`: one-shot generation by default, plus the `convert`, `inspect` and `perplexity` subcommands."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from ninfer.errors import NinferError

# subcommand -> (module under ninfer.cli, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "convert": ("convert", "convert a Hugging Face folder or a GGUF file into a .ninfer artifact"),
    "inspect": ("inspect", "show an artifact's manifest: config, tensors, encodings, frontend resources"),
    "perplexity": ("perplexity", "measure a model's perplexity on a text file"),
}


class CliError(Exception):
    """An option or input error: printed as one line, exit status 2."""


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (`PROG: error: ...`, exit status 2) like every other CLI
    error, instead of the whole usage block; `--help` still prints the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _build_subcommand_parser(name: str) -> tuple[argparse.ArgumentParser, object]:
    module_name, help_text = SUBCOMMANDS[name]
    module = importlib.import_module(f"ninfer.cli.{module_name}")
    parser = OneLineErrorParser(prog=f"ninfer {name}", description=help_text)
    module.add_arguments(parser)
    return parser, module


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        parser, module = _build_subcommand_parser(argv[0])
        args = parser.parse_args(argv[1:])
    else:
        module = importlib.import_module("ninfer.cli.generate")
        parser = OneLineErrorParser(
            prog="ninfer",
            description="Generate an answer with a .ninfer model. Subcommands: "
            + ", ".join(f"{k} ({v[1]})" for k, v in SUBCOMMANDS.items()),
        )
        module.add_arguments(parser)
        args = parser.parse_args(argv)
    try:
        return int(module.run(args) or 0)
    except (CliError, NinferError) as exc:
        print(f"ninfer: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
