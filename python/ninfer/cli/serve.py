"""`ninfer-serve [MODEL] [options]`: the HTTP server (Litestar on uvicorn). Argument parsing and validation only;
the app is ninfer.serve.app. With no MODEL it serves the embedded default model (imported once into the cache).

Options that later issues implement (the MTP draft's lm-head shortlist, state offload, memory reservations) are
parsed and validated now, and refused with a one-line error when given, so scripts and the Nix module fail clearly.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from ninfer.cli.generate import KV_DTYPES, resolve_model
from ninfer.cli.main import CliError, OneLineErrorParser
from ninfer.cli.media_options import add_media_arguments, media_limits
from ninfer.cli.spec_options import add_spec_arguments, check_spec_arguments, spec_options
from ninfer.errors import NinferError
from ninfer.serve.auth import read_api_keys
from ninfer.serve.shutdown import DEFAULT_GRACE_S

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

# option dest -> the issue that brings it (for the refusal message)
NOT_YET = {
    "lm_head_draft": "the MTP draft's lm-head shortlist",
    "reserve_gib": "GPU memory planning",
}


def _positive(name: str, minimum: int = 1):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be >= {minimum}, got {value}")
        return value

    return parse


def _kv_capacity(text: str) -> int | str:
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--kv-capacity must be a number of tokens (>= 1) or auto, got {text!r}")
    return int(text)


def _non_negative_float(name: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not value >= 0:
            raise argparse.ArgumentTypeError(f"{name} must be >= 0, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog="ninfer-serve",
        description="Serve a .ninfer model over HTTP: OpenAI Chat / "
        "Completions / Responses, Anthropic Messages, llama.cpp-style utilities.",
    )
    p.add_argument(
        "model", nargs="?", help="a .ninfer artifact (default: the embedded SmolLM2-135M-Instruct)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=_positive("--port"), default=8080, help="TCP port (default 8080)")
    p.add_argument("--alias", metavar="NAME", help="the name clients see for MODEL (default: its file name)")
    p.add_argument("--config", metavar="FILE",
                   help='router JSON config for one or several models ({"models": {NAME: {"path": ...}}})')
    engine = p.add_argument_group("engine")
    engine.add_argument(
        "--max-context",
        type=_positive("--max-context"),
        default=4096,
        metavar="N",
        help="longest sequence, prompt + output (default 4096)",
    )
    engine.add_argument(
        "--kv-capacity",
        type=_kv_capacity,
        metavar="TOKENS|auto",
        help="tokens in the KV pool (default max-context x max-concurrency); auto: the most that fits in GPU "
        "memory after the weights, with 1 GiB to spare (on the CPU backend, the default)",
    )
    engine.add_argument(
        "--max-concurrency",
        type=_positive("--max-concurrency"),
        default=4,
        metavar="N",
        help="requests generated at once, 1..8 (default 4)",
    )
    engine.add_argument(
        "--max-queue",
        type=_positive("--max-queue", 0),
        default=16,
        metavar="N",
        help="requests that may wait for a lane before the server answers 429 (default 16)",
    )
    for flag, least, default, what in DECISION_FLAGS:
        engine.add_argument(flag, type=_positive(flag, least), default=default, metavar="N",
                            help=f"{what} (default {default})")
    engine.add_argument(
        "--kv-dtype", default="bf16", choices=KV_DTYPES, help="KV cache storage (default bf16)"
    )
    engine.add_argument(
        "--prefill-chunk",
        type=_positive("--prefill-chunk", 0),
        default=0,
        metavar="N",
        help="prompt tokens per prefill step, a multiple of 64; 0 (default) = auto: 512 on the CPU, up to 8192 "
        "on a GPU as memory allows",
    )
    engine.add_argument(
        "--decoding-prefill-chunk",
        type=_positive("--decoding-prefill-chunk", 0),
        default=0,
        metavar="N",
        help="prompt tokens per prefill step while other requests are decoding (each of their tokens then waits "
        "at most one such step), a multiple of 64 up to --prefill-chunk; 0 (default) = auto: the prefill chunk "
        "on the CPU, at most 2048 on a GPU",
    )
    engine.add_argument(
        "--prefix-cache",
        choices=("on", "off"),
        default="on",
        help="reuse the KV blocks (and GDN state snapshots) of earlier prompts that a prompt starts with (default on)",
    )
    engine.add_argument(
        "--device-state-slots",
        type=_positive("--device-state-slots", 0),
        default=0,
        metavar="N",
        help="Gated DeltaNet state slots: one per lane, the rest hold prefix-cache snapshots; 0 (default) = auto: "
        "2 x max-concurrency + 4 with the prefix cache on, max-concurrency with it off",
    )
    engine.add_argument(
        "--snapshot-interval",
        type=_positive("--snapshot-interval", 0),
        default=0,
        metavar="TOKENS",
        help="tokens between interior state snapshots of a long prompt (a multiple of 64), so an edited message "
        "reuses the part before it; 0 (default) = auto: max(4096, 2 x prefill chunk)",
    )
    engine.add_argument(
        "--host-kv-mib",
        type=_positive("--host-kv-mib", 0),
        default=0,
        metavar="MIB",
        help="host memory for prefix-cache KV blocks the GPU evicts (page-locked on CUDA), restored from there "
        "instead of recomputed; kept across a router swap, so a model loaded again resumes warm; 0 (default) = none",
    )
    engine.add_argument(
        "--host-state-slots",
        type=_positive("--host-state-slots", 0),
        default=0,
        metavar="N",
        help="Gated DeltaNet state snapshots the host tier holds beside --host-kv-mib (each one state image: "
        "~147 MiB for Qwen3.5-27B, ~61 MiB for 35B-A3B); 0 (default) = none",
    )
    engine.add_argument(
        "--threads",
        type=_positive("--threads", 0),
        default=0,
        metavar="N",
        help="CPU threads (default: all cores)",
    )
    engine.add_argument(
        "--vision",
        action="store_true",
        help="load the vision tower: requests may carry images and video (Qwen3.5 artifacts; docs/vision.md); "
        "without it a request with media is a 400",
    )
    engine.add_argument(
        "--preserve-thinking",
        action="store_true",
        help="keep earlier assistant turns' reasoning in the prompt (templates that support it)",
    )
    add_spec_arguments(engine)
    add_media_arguments(p)
    later = p.add_argument_group("options of later releases (validated, refused for now)")
    later.add_argument("--lm-head-draft", type=_positive("--lm-head-draft"), metavar="N")
    later.add_argument("--reserve-gib", type=_non_negative_float("--reserve-gib"), metavar="GIB")
    server = p.add_argument_group("server")
    server.add_argument("--api-key-file", metavar="FILE", help="API keys, one per line; requests need one")
    server.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="(default info)")
    server.add_argument(
        "--webui", action="store_true", help="serve the pinned llama.cpp web UI at / (built by `make webui`)"
    )
    server.add_argument(
        "--webui-dir", metavar="DIR", help="serve this web UI bundle (a folder with index.html)"
    )
    server.add_argument(
        "--shutdown-grace", type=_non_negative_float("--shutdown-grace"), default=DEFAULT_GRACE_S, metavar="S",
        help=f"on SIGTERM, seconds running requests get to finish before their streams are ended with an error "
        f"(new requests get 503 meanwhile; default {DEFAULT_GRACE_S:g})",
    )
    server.add_argument(
        "--print-systemd-unit",
        action="store_true",
        help="print a hardened systemd unit that runs ninfer-serve with the other options given, and exit",
    )
    return p


def _check(args: argparse.Namespace) -> None:
    check_spec_arguments(args)
    media_limits(args)  # a bad limit is refused here, before anything loads
    for dest, feature in NOT_YET.items():
        given = getattr(args, dest)
        if given is not None and given is not False:  # (not `in (None, False)`: 0 == False, and 0 is given)
            flag = "--" + dest.replace("_", "-")
            raise CliError(f"{flag}: {feature} is not implemented yet in this build")
    if args.max_concurrency > 8:
        raise CliError(f"--max-concurrency must be in 1..8, got {args.max_concurrency}")
    if args.prefill_chunk % 64:
        raise CliError(f"--prefill-chunk must be a multiple of 64, got {args.prefill_chunk}")
    if args.decoding_prefill_chunk % 64:
        raise CliError(f"--decoding-prefill-chunk must be a multiple of 64, got {args.decoding_prefill_chunk}")
    if args.prefill_chunk and args.decoding_prefill_chunk > args.prefill_chunk:
        raise CliError(f"--decoding-prefill-chunk {args.decoding_prefill_chunk} is above --prefill-chunk "
                       f"{args.prefill_chunk}")
    if args.snapshot_interval % 64:
        raise CliError(f"--snapshot-interval must be a multiple of 64, got {args.snapshot_interval}")
    if args.prefix_cache == "off" and (args.host_kv_mib or args.host_state_slots):
        raise CliError("--host-kv-mib / --host-state-slots keep prefix-cache contents: they need --prefix-cache on")
    if 0 < args.device_state_slots < args.max_concurrency:
        raise CliError(f"--device-state-slots ({args.device_state_slots}) must be 0 (auto) or at least "
                       f"--max-concurrency ({args.max_concurrency}): one per lane")
    if isinstance(args.kv_capacity, int) and args.kv_capacity < args.max_context:
        raise CliError(
            f"--kv-capacity ({args.kv_capacity}) must hold at least one full context "
            f"(--max-context {args.max_context})"
        )
    if args.port > 65535:
        raise CliError(f"--port must be in 1..65535, got {args.port}")
    if args.webui_dir is not None and not (Path(args.webui_dir) / "index.html").is_file():
        raise CliError(f"--webui-dir {args.webui_dir} has no index.html")
    if args.config is not None and args.model is not None:
        raise CliError("give either MODEL or --config, not both")
    if args.config is not None and args.alias is not None:
        raise CliError("--alias names the one MODEL; with --config, give the model 'aliases' in the config")


# Decision scoring (docs/decisions.md): flag, least value, default, what it sets.
DECISION_FLAGS = (
    ("--decision-lanes", 0, 1,
     "lanes that run decision jobs only (/v1/decisions, /v1/systemone, /v1/rerank), 0..8; 0 refuses them"),
    ("--decision-rows", 1, 16,
     "questions of one decision request answered at once (one forward pass), 1..64; more run as rounds"),
    ("--decision-max-questions", 1, 256, "questions (or rerank documents) per decision request; more is a 413"),
    ("--decision-max-tokens", 1, 64_000,
     "rendered tokens of one decision request, its context and every question together; more is a 413"),
)


def _engine_options(args: argparse.Namespace) -> Any:
    from ninfer.engine import EngineOptions

    return EngineOptions(
        max_context=args.max_context,
        kv_capacity=args.kv_capacity,
        max_concurrency=args.max_concurrency,
        max_queue=args.max_queue,
        decision_lanes=args.decision_lanes,
        decision_rows=args.decision_rows,
        kv_dtype=args.kv_dtype,
        prefill_chunk=args.prefill_chunk,
        decoding_prefill_chunk=args.decoding_prefill_chunk,
        threads=args.threads,
        vision=args.vision,
        media_limits=media_limits(args),
        prefix_cache=args.prefix_cache == "on",
        device_state_slots=args.device_state_slots,
        snapshot_interval=args.snapshot_interval,
        host_kv_mib=args.host_kv_mib,
        host_state_slots=args.host_state_slots,
        **spec_options(args),
    )


def _router_config(args: argparse.Namespace) -> Any:
    """--config FILE, else the one MODEL (or the embedded default) as a one-model router config. Nothing is loaded:
    the router loads a model on its first request; files are checked here so a wrong path is a one-line error."""
    from ninfer.artifact.reader import read_artifact
    from ninfer.serve.router_config import load_config, single_model_config

    if args.config is not None:
        config = load_config(args.config, defaults=_engine_options(args))
        if args.preserve_thinking:  # the default of every model whose entry does not set preserve_thinking itself
            config = replace(config, models=tuple(
                replace(m, preserve_thinking=True) if m.preserve_thinking is None else m for m in config.models))
        missing = [f"{m.name} ({m.path})" for m in config.models if not m.path.is_file()]
        if missing:
            raise CliError(f"--config {args.config}: no artifact for {', '.join(missing)}")
        return config
    path = resolve_model(args.model)
    read_artifact(path)  # header and manifest: a file that is not an artifact fails here, not at the first request
    return single_model_config(path, args.alias or path.name.removesuffix(".ninfer"), _engine_options(args),
                               preserve_thinking=args.preserve_thinking or None)


def _app(args: argparse.Namespace, keys: frozenset[str]) -> Any:
    from ninfer.decisions.contract import DecisionLimits
    from ninfer.serve.app import create_app
    from ninfer.serve.decisions import LIMITS_STATE_KEY
    from ninfer.serve.router import ModelRouter
    from ninfer.serve.webui_bundle import installed_bundle

    config = _router_config(args)
    webui_dir = args.webui_dir or (str(installed_bundle()) if args.webui else None)
    url = f"http://{args.host if ':' not in args.host else f'[{args.host}]'}:{args.port}"

    async def open_router() -> ModelRouter:
        names = ", ".join(m.name for m in config.models)
        print(f"ninfer-serve: serving {names} at {url} (OpenAI base URL {url}/v1)", file=sys.stderr, flush=True)
        return ModelRouter(config)

    app = create_app(open_router, api_keys=keys, webui_dir=webui_dir)
    app.state[LIMITS_STATE_KEY] = DecisionLimits(max_questions=args.decision_max_questions,
                                                 max_total_tokens=args.decision_max_tokens)
    return app


# Options the unit renders itself (ExecStart's fixed part, LoadCredential); every other option that differs from its
# default is passed on after them.
_UNIT_MANAGED = {
    "model", "host", "port", "log_level", "config", "api_key_file", "webui", "webui_dir", "print_systemd_unit",
    "shutdown_grace",
}


def _unit_options(args: argparse.Namespace) -> Any:
    """The systemd unit's options for this command line, with paths made absolute (the unit runs elsewhere)."""
    from ninfer.systemd_unit import UnitOptions

    def absolute(path: str | None) -> str | None:
        return None if path is None else os.path.abspath(path)

    executable = sys.argv[0] if Path(sys.argv[0]).name == "ninfer-serve" else shutil.which("ninfer-serve")
    if executable is None:
        raise CliError("--print-systemd-unit: cannot find the ninfer-serve executable (is it on PATH?)")
    defaults = vars(build_parser().parse_args([]))
    extra: list[str] = []
    for dest, value in vars(args).items():
        if dest in _UNIT_MANAGED or value == defaults[dest]:
            continue
        flag = "--" + dest.replace("_", "-")
        extra += [flag] if value is True else [flag, str(value)]
    return UnitOptions(
        executable=os.path.abspath(executable),
        host=args.host,
        port=args.port,
        model=absolute(args.model),
        config_file=absolute(args.config),
        log_level=args.log_level,
        api_key_file=absolute(args.api_key_file),
        webui=args.webui,
        webui_dir=absolute(args.webui_dir),
        extra_flags=tuple(extra),
        shutdown_grace_s=args.shutdown_grace,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _check(args)
        if args.print_systemd_unit:
            from ninfer.systemd_unit import render_unit

            if args.webui and args.webui_dir is None:  # as the NixOS module asserts
                raise CliError("--webui in a service needs --webui-dir: a built llama-ui bundle (the service's "
                               "cache has none from `make webui`)")

            print(render_unit(_unit_options(args)), end="")
            return 0
        keys = read_api_keys(args.api_key_file) if args.api_key_file else frozenset()
        app = _app(args, keys)
    except (CliError, NinferError) as exc:
        print(f"ninfer-serve: error: {exc}", file=sys.stderr)
        return 2
    from ninfer.serve.graceful_server import GracefulServer

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        GracefulServer.serve_app(app, host=args.host, port=args.port, log_level=args.log_level,
                                 grace_s=args.shutdown_grace)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
