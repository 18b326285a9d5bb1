"""`ninfer inspect FILE`: an artifact's tensors (a table) and its config, frontend and recipe, or `--json`."""

from __future__ import annotations

import argparse
import json
from collections import Counter

from ninfer.artifact.reader import ArtifactInfo, read_artifact

_CONFIG_KEYS = (
    "arch",
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "tie_word_embeddings",
    "max_position_embeddings",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the .ninfer artifact")
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")
    parser.add_argument("--full", action="store_true", help="with --json: include the tokenizer.json text")
    parser.add_argument(
        "--verify", action="store_true", help="also verify every blob's checksum (reads the file)"
    )


def run(args: argparse.Namespace) -> int:
    info = read_artifact(args.file, verify_checksums=args.verify)
    print(
        json.dumps(manifest_for_display(info, args.full), indent=2, ensure_ascii=False)
        if args.json
        else render(info)
    )
    return 0


def manifest_for_display(info: ArtifactInfo, full: bool) -> dict:
    """The manifest, with the multi-megabyte tokenizer replaced by its size unless `full`."""
    if full or not isinstance(info.frontend.get("tokenizer_json"), str):
        return info.manifest
    frontend = {
        **info.frontend,
        "tokenizer_json": f"<{len(info.frontend['tokenizer_json'])} characters; --full shows them>",
    }
    return {**info.manifest, "frontend": frontend}


def _human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _table(rows: list[tuple[str, ...]], right_aligned: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(w) if i in right_aligned else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def render(info: ArtifactInfo) -> str:
    rows = [("name", "encoding", "shape", "group", "bytes")]
    by_encoding: Counter[str] = Counter()
    total = 0
    for entry in info.tensors:
        nbytes = sum(blob["nbytes"] for blob in entry["blobs"].values())
        by_encoding[entry["encoding"]] += nbytes
        total += nbytes
        rows.append(
            (
                entry["name"],
                entry["encoding"],
                "x".join(map(str, entry["shape"])),
                str(entry.get("group_size") or "-"),
                _human_bytes(nbytes),
            )
        )
    lines = [
        f"{info.path}: .ninfer v{info.version}, {len(info.tensors)} tensors, {_human_bytes(total)} weights",
        "",
    ]
    lines += _table(rows, right_aligned={4})
    lines += [
        "",
        "by encoding: " + ", ".join(f"{enc} {_human_bytes(n)}" for enc, n in by_encoding.most_common()),
    ]
    config = ", ".join(f"{key}={info.config[key]}" for key in _CONFIG_KEYS if key in info.config)
    lines += ["", f"config:   {config}"]
    for section in ("linear_attention", "moe", "mtp"):
        if info.config.get(section):
            lines.append(f"          {section}: {json.dumps(info.config[section])}")
    lines.append(f"frontend: {_frontend_summary(info.frontend)}")
    lines.append(f"recipe:   {info.recipe.get('name', '?')} ({len(info.recipe.get('rules') or [])} rules)")
    lines.append(f"source:   {', '.join(f'{k}={v}' for k, v in info.source.items())}")
    return "\n".join(lines)


def _frontend_summary(frontend: dict) -> str:
    parts = []
    tokenizer = frontend.get("tokenizer_json")
    parts.append(
        f"tokenizer.json {_human_bytes(len(tokenizer.encode()))}"
        if isinstance(tokenizer, str)
        else "no tokenizer"
    )
    templates = frontend.get("chat_templates")
    if isinstance(templates, dict) and templates:
        parts.append(f"chat templates: {', '.join(templates)}")
    for key in ("generation_defaults", "special_tokens"):
        if frontend.get(key):
            parts.append(f"{key.replace('_', ' ')}: {json.dumps(frontend[key])}")
    if frontend.get("preprocessing"):
        parts.append("preprocessing config")
    return "; ".join(parts)
