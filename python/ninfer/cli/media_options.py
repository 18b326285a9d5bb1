"""The media limit options `ninfer` and `ninfer-serve` share: one `--max-...` flag per MediaLimits field (the
field's name with dashes; its default and help from the field), so a new limit is an option without more code."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from ninfer.cli.main import CliError
from ninfer.frontend.media_limits import MediaLimits


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_media_arguments(parser: argparse.ArgumentParser | Any) -> None:
    group = parser.add_argument_group("media limits", "with images or video (docs/vision.md); over one is a 400")
    for f in fields(MediaLimits):
        group.add_argument(_flag(f.name), type=int, metavar="N", help=f"{f.metadata['help']} (default {f.default})")


def media_limits(args: argparse.Namespace) -> MediaLimits:
    """The MediaLimits of the parsed arguments (the defaults where none is given)."""
    given = {f.name: getattr(args, f.name) for f in fields(MediaLimits) if getattr(args, f.name) is not None}
    for name, value in given.items():
        if value < 1:
            raise CliError(f"{_flag(name)} must be a positive integer, got {value}")
    return MediaLimits(**given)
