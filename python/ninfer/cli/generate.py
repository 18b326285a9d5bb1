"""`ninfer [MODEL] --prompt TEXT | --messages FILE [--image PATH ...] [options]`: one answer on stdout; reasoning and the timing,
throughput and memory report on stderr. Argument parsing and display only: the work is in ninfer.engine."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from ninfer.cli.main import CliError
from ninfer.cli.media_options import add_media_arguments, media_limits
from ninfer.cli.spec_options import add_spec_arguments, check_spec_arguments, spec_options
from ninfer.engine import (
    KV_DTYPES,
    Engine,
    EngineOptions,
    GenerationEvent,
    Request,
    SamplingParams,
)
from ninfer.frontend.chat_media import extract_media
from ninfer.frontend.reasoning import ReasoningParser
from ninfer.frontend.sampling_defaults import recommended_sampling
from ninfer.frontend.text import TextStream


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """MODEL and the engine options that `ninfer` and `ninfer perplexity` share."""
    parser.add_argument("model", nargs="?", help="a .ninfer artifact (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--max-context", type=int, default=4096, metavar="N", help="longest sequence (default 4096)")
    parser.add_argument("--kv-dtype", default="bf16", choices=KV_DTYPES, help="KV cache storage (default bf16)")
    parser.add_argument("--threads", type=int, default=0, metavar="N", help="CPU threads (default: all cores)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompt", metavar="TEXT", help="a user message")
    source.add_argument("--messages", metavar="FILE", help="a JSON file with a list of chat messages (image / video "
                        "parts may name local files: {\"type\": \"image\", \"image\": PATH})")
    parser.add_argument("--image", action="append", default=[], metavar="PATH",
                        help="an image for the (last) user message, repeatable; loads the vision tower")
    parser.add_argument("--max-new", type=int, default=512, metavar="N", help="most tokens to generate (default 512)")
    parser.add_argument("--temperature", type=float, metavar="T", help="0 = greedy (default: the model's)")
    parser.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling, in (0, 1] (default: the model's)")
    parser.add_argument("--top-k", type=int, metavar="K",
                        help="sample among the K likeliest tokens, 0 = off (default: the model's)")
    parser.add_argument("--seed", type=int, metavar="S", help="makes sampling reproducible")
    parser.add_argument("--no-think", action="store_true", help="turn the model's thinking off")
    add_spec_arguments(parser)
    add_media_arguments(parser)


def resolve_model(model: str | None) -> Path:
    """The given artifact, checked to exist, or the embedded default (imported on first use)."""
    if model is None:
        from ninfer.default_model import default_model_path

        return default_model_path(progress=sys.stderr.isatty())
    path = Path(model)
    if not path.is_file():
        raise CliError(f"model file not found: {model}")
    return path


def open_engine(args: argparse.Namespace, max_concurrency: int = 1, **options: Any) -> Engine:
    """The engine for MODEL and the shared engine arguments; `options`: more EngineOptions fields."""
    if args.max_context < 1:
        raise CliError(f"--max-context must be >= 1, got {args.max_context}")
    path = resolve_model(args.model)
    engine_options = EngineOptions(max_context=args.max_context, kv_dtype=args.kv_dtype, threads=args.threads,
                                   max_concurrency=max_concurrency, **options)
    if sys.stderr.isatty():
        print(f"loading {path.name} ...", end="\r", file=sys.stderr, flush=True)
    engine = Engine.open_sync(path, engine_options)
    if sys.stderr.isatty():
        print(" " * (len(path.name) + 12), end="\r", file=sys.stderr, flush=True)
    return engine


def _messages(args: argparse.Namespace) -> list[dict[str, Any]]:
    messages = _given_messages(args)
    if args.image:
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            raise CliError("--image needs a user message to attach to")
        last = messages[users[-1]]
        content = last.get("content")
        text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        last["content"] = [{"type": "image", "image": path} for path in args.image] + text
    return messages


def _given_messages(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.prompt is not None:
        return [{"role": "user", "content": args.prompt}]
    if args.messages is None:
        raise CliError("give --prompt TEXT or --messages FILE")
    try:
        messages = json.loads(Path(args.messages).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CliError(f"cannot read --messages file: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise CliError(f"--messages file {args.messages} is not JSON: {exc}") from exc
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise CliError(f"--messages file {args.messages} must hold a list of {{'role': ..., 'content': ...}}")
    return messages


def _sampling(args: argparse.Namespace, engine: Engine) -> SamplingParams:
    # The server's recommended defaults (thinking mode: the templates' default)
    defaults = recommended_sampling(engine.info.arch, engine.frontend.generation_defaults, {}, thinking=True)
    chosen = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed}
    return SamplingParams(**{**defaults.__dict__, **{k: v for k, v in chosen.items() if v is not None}})


def _report(engine: Engine, last: GenerationEvent) -> None:
    usage, t = last.usage, last.timings
    stats = engine.stats()
    print(f"\n[{last.finish_reason}] prompt {usage.prompt_tokens} tokens, generated {usage.generated_tokens}; "
          f"TTFT {t.ttft_s * 1000:.0f} ms, prefill {t.prefill_tokens_per_s:.1f} tok/s, "
          f"decode {t.decode_tokens_per_s:.1f} tok/s{_draft_report(t)}; "
          f"resident memory {stats.resident_bytes / 2**20:.0f} MiB",
          file=sys.stderr)


def _draft_report(t: Any) -> str:
    """Speculative decoding's acceptance, when it drafted."""
    if not t.draft_n:
        return ""
    return f"; drafts accepted {t.draft_n_accepted}/{t.draft_n} ({100 * t.draft_n_accepted / t.draft_n:.0f}%)"


async def _generate(engine: Engine, args: argparse.Namespace, messages: list[dict[str, Any]]) -> GenerationEvent:
    messages, media_parts = extract_media(messages, allow_files=True)
    rendered = engine.frontend.render(messages, enable_thinking=False if args.no_think else None)
    if media_parts:
        token_ids, media = engine.frontend.encode_with_media(rendered.text, media_parts)
    else:
        token_ids, media = engine.frontend.encode(rendered.text), None
    request = Request(token_ids, _sampling(args, engine), max_new_tokens=args.max_new, media=media)
    text = TextStream(engine.frontend)
    split = ReasoningParser(starts_in_reasoning=rendered.starts_in_reasoning)
    last = None
    async for ev in engine.generate(request):
        delta = split.feed(text.push(ev.token_ids))
        _show(delta.reasoning, delta.content)
        last = ev
    tail = split.finish()
    _show(tail.reasoning, tail.content)
    sys.stdout.write("\n")
    return last


def _show(reasoning: str, content: str) -> None:
    if reasoning:
        sys.stderr.write(reasoning)
        sys.stderr.flush()
    if content:
        sys.stdout.write(content)
        sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    if args.max_new < 1:
        raise CliError(f"--max-new must be >= 1, got {args.max_new}")
    check_spec_arguments(args)
    messages = _messages(args)
    # The tower is loaded only for a prompt with media (it costs load time and memory otherwise).
    vision = bool(extract_media(messages, allow_files=True)[1])
    with open_engine(args, vision=vision, media_limits=media_limits(args), **spec_options(args)) as engine:
        last = asyncio.run(_generate(engine, args, messages))
        _report(engine, last)
    return 0
