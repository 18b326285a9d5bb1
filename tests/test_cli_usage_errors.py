"""`ninfer` and its subcommands: a usage error (unknown option, missing or malformed value) is one line
on stderr, `PROG: error: ...`, with exit status 2, as docs/cli.md says; `--help` still prints the full usage.
No model is loaded: argparse refuses these before anything runs."""

from __future__ import annotations

import pytest
from ninfer.cli.main import main


@pytest.mark.parametrize(
    ("argv", "prog", "message"),
    [
        (["--bogus"], "ninfer", "unrecognized arguments: --bogus"),
        (["--max-new", "many"], "ninfer", "argument --max-new: invalid int value: 'many'"),
        (["--kv-dtype", "q3"], "ninfer", "argument --kv-dtype: invalid choice: 'q3'"),
        (["perplexity"], "ninfer perplexity", "the following arguments are required: --text-file"),
        (["perplexity", "--text-file", "t.txt", "--context", "x"], "ninfer perplexity",
         "argument --context: invalid int value: 'x'"),
        (["convert", "src"], "ninfer convert", "the following arguments are required: out"),
        (["convert", "src", "out", "--template", "llama9"], "ninfer convert",
         "argument --template: invalid choice"),
        (["inspect", "--jsn", "f.ninfer"], "ninfer inspect", "unrecognized arguments: --jsn"),
    ],
)
def test_usage_errors_are_one_line(argv, prog, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"{prog}: error: {message}") and line.endswith(f"(see {prog} --help)")
    assert captured.out == ""


@pytest.mark.parametrize(("argv", "usage"), [(["--help"], "usage: ninfer "),
                                             (["perplexity", "--help"], "usage: ninfer perplexity ")])
def test_help_still_prints_the_usage(argv, usage, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0 and capsys.readouterr().out.startswith(usage)


@pytest.mark.parametrize(("argv", "message"), [
    (["--prompt", "hi", "--draft-tokens", "2"], "--draft-tokens needs --spec mtp"),
    (["--prompt", "hi", "--spec", "mtp", "--draft-tokens", "6"], "--draft-tokens must be in 1..5, got 6"),
    (["--prompt", "hi", "--spec", "draft"], "--spec draft: a separate draft model is not implemented yet"),
])
def test_speculative_options_are_checked_before_loading(argv, message, capsys):
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"ninfer: error: {message}")
