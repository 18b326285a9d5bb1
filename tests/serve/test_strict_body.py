"""ninfer.serve.strict_body's reading of whole-number floats and its piecewise JSON decoding, without a server
(test_request_fuzz.py checks the live routes)."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest
from ninfer.serve.openai_chat import ChatCompletionRequest
from ninfer.serve.strict_body import decode_json_in_pieces, whole_floats_as_ints


def test_whole_floats_become_ints_at_any_depth_and_nothing_else_changes():
    body = {"a": 3.0, "b": [1.0, 2.5, {"c": -0.0, "d": True}], "e": "4.0", "f": None, "g": 7}
    converted = whole_floats_as_ints(body)
    assert converted == {"a": 3, "b": [1, 2.5, {"c": 0, "d": True}], "e": "4.0", "f": None, "g": 7}
    assert [type(v) for v in (converted["a"], converted["b"][0], converted["b"][2]["c"], converted["b"][1])] == [
        int, int, int, float]
    assert converted["b"][2]["d"] is True  # a bool is not a number here
    assert body["a"] == 3.0 and isinstance(body["a"], float)  # the decoded body itself is left as it came


def test_floats_too_large_to_be_exact_integers_stay_floats():
    assert whole_floats_as_ints(2.0**53) == 2**53
    assert isinstance(whole_floats_as_ints(2.0**54), float)
    assert isinstance(whole_floats_as_ints(1e300), float)


@pytest.mark.parametrize(("field", "value", "accepted"), [
    ("max_tokens", 8.0, True), ("max_tokens", 8.5, False), ("top_k", 40.0, True),
    ("temperature", 1.0, True), ("temperature", 0.5, True), ("seed", 1e300, False), ("logprobs", 1.0, False),
])
def test_the_strict_check_takes_a_whole_float_for_an_integer_only(field, value, accepted):
    body = {"messages": [{"role": "user", "content": "hi"}], field: value}
    try:
        msgspec.convert(whole_floats_as_ints(body), ChatCompletionRequest, strict=True, str_keys=True)
    except msgspec.ValidationError:
        assert not accepted
    else:
        assert accepted


# decode_json_in_pieces against its slow, obviously right twin, a whole msgspec decode, on fresh random documents:
# each is encoded with random whitespace, then sometimes damaged (cut short, a byte changed, a byte inserted), and
# decoded with piece sizes small enough that every level of it is split.
def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.choice(["object", "array"] * (4 - depth) + ["string", "int", "float", "bool", "null"] * 2)
    if kind == "object" and depth < 4:
        return {rng.choice(["a", "b", "ü", "k" * rng.randint(1, 9), 'q"\\']): _random_value(rng, depth + 1)
                for _ in range(rng.randint(0, 6))}
    if kind == "array" and depth < 4:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 6))]
    scalars = {"string": lambda: "".join(rng.choice("ab\n\"\\é😀") for _ in range(rng.randint(0, 12))),
               "int": lambda: rng.randint(-2**70, 2**70),
               "float": lambda: rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-8, 8),
               "bool": lambda: rng.random() < 0.5, "null": lambda: None}
    return scalars.get(kind, lambda: 1.0)()  # a container kind past the depth: a whole float


def _random_text(rng: random.Random, value: Any) -> bytes:
    """`value` as JSON, with random JSON whitespace around and between its tokens, and now and then an object's
    key repeated with another value (the last one wins)."""
    space = lambda: "".join(rng.choice(" \t\n\r") for _ in range(rng.choice([0, 0, 1, 3])))  # noqa: E731
    if isinstance(value, dict):
        members = [f"{space()}{json.dumps(k)}{space()}:{_random_text(rng, v).decode()}" for k, v in value.items()]
        if members and rng.random() < 0.3:
            key = rng.choice(list(value))
            members.insert(rng.randrange(len(members) + 1), f"{json.dumps(key)}:{_random_text(rng, [key]).decode()}")
        text = "{" + ",".join(members) + space() + "}"
    elif isinstance(value, list):
        text = "[" + ",".join(_random_text(rng, v).decode() for v in value) + space() + "]"
    else:
        text = json.dumps(value)
    return (space() + text + space()).encode()


def _damaged(rng: random.Random, text: bytes) -> bytes:
    where = rng.randrange(len(text) + 1)
    inserted = rng.choice([b",", b"]", b"}", b"{", b'"', b"\\", b"\x0c"])  # \x0c: whitespace to Python, not JSON
    return rng.choice([lambda: text[:where], lambda: text[:where] + bytes([rng.randrange(256)]) + text[where + 1:],
                       lambda: text[:where] + inserted + text[where:]])()


def _outcome(decode: Any, text: bytes) -> tuple[str, str]:
    try:
        return "value", msgspec.json.encode(decode(text)).decode()  # types and key order kept (1 is not 1.0)
    except (msgspec.DecodeError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


def test_decoding_in_pieces_gives_the_whole_decode_s_value_or_error_on_random_documents():
    rng = random.Random()  # fresh inputs on every run; the failing document is printed by the assertion
    damaged_seen = 0
    for _ in range(400):
        text = _random_text(rng, {"messages": [_random_value(rng) for _ in range(rng.randint(0, 5))],
                                  "x": _random_value(rng)})
        if rng.random() < 0.5:
            text, damaged_seen = _damaged(rng, text), damaged_seen + 1
        expected = _outcome(msgspec.json.decode, text)
        for piece_bytes in (0, 1, 7, 64, 10**9):
            assert _outcome(lambda t: decode_json_in_pieces(t, piece_bytes), text) == expected, (text, piece_bytes)
    assert damaged_seen > 100


def test_a_bad_byte_under_a_replaced_duplicate_key_is_refused_as_a_whole_decode_refuses_it():
    """The document the random test found: an object's first "k" holds invalid UTF-8, a later "k" replaces it. The
    scan that splits the object keeps only the last value, so the pieces alone would accept what the whole refuses."""
    body = b'{"messages": [{"k": ["kk\x8dkkk"], "k": 884.5}], "x": []}'
    with pytest.raises(msgspec.DecodeError) as whole:
        msgspec.json.decode(body)
    for piece_bytes in (0, 1, 7, 64, 10**9):
        with pytest.raises(msgspec.DecodeError) as pieces:
            decode_json_in_pieces(body, piece_bytes)
        assert str(pieces.value) == str(whole.value)


def test_a_body_nested_deeper_than_the_recursion_is_refused_as_a_whole_decode_refuses_it():
    text = b"[" * 100_000 + b"]" * 100_000
    assert _outcome(lambda t: decode_json_in_pieces(t, 16), text) == _outcome(msgspec.json.decode, text)


def _whole_floats_copied(value: Any) -> Any:
    """whole_floats_as_ints' obviously right twin: a full copy, every whole float made an int."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, list):
        return [_whole_floats_copied(item) for item in value]
    if isinstance(value, dict):
        return {key: _whole_floats_copied(item) for key, item in value.items()}
    return value


def _has_whole_float(value: Any) -> bool:
    if isinstance(value, list):
        return any(_has_whole_float(item) for item in value)
    if isinstance(value, dict):
        return any(_has_whole_float(item) for item in value.values())
    return isinstance(value, float) and value.is_integer() and abs(value) <= 2**53


def test_whole_floats_as_ints_matches_a_full_copy_and_shares_what_it_leaves_unchanged():
    rng = random.Random()  # fresh inputs on every run
    shared = 0
    for _ in range(500):
        value = _random_value(rng)
        if rng.random() < 0.5:  # whole floats somewhere, or none
            value = [value, rng.choice([2.0, -0.0, 3.5, 2.0**60, 7])]
        converted, before = whole_floats_as_ints(value), msgspec.json.encode(value)
        assert msgspec.json.encode(converted) == msgspec.json.encode(_whole_floats_copied(value)), value
        assert msgspec.json.encode(value) == before  # the input itself is left as it came
        if isinstance(value, (list, dict)) and not _has_whole_float(value):
            assert converted is value
            shared += 1
    assert shared > 20
