"""ninfer.serve.strict_body's reading of whole-number floats, without a server (test_request_fuzz.py checks the
live routes)."""

from __future__ import annotations

import msgspec
import pytest
from ninfer.serve.openai_chat import ChatCompletionRequest
from ninfer.serve.strict_body import whole_floats_as_ints


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
