"""Command-line entry points. Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`."""
