"""Stop strings across chunk boundaries: the stream agrees with a brute-force whole-text answer."""

from hypothesis import given, settings
from hypothesis import strategies as st
from ninfer.frontend.stop_strings import StopStringMatcher, find_stop, partial_suffix_len
from test_frontend_chunks import chunkings

SMALL = st.text(alphabet="abc\n", max_size=40)  # a small alphabet so stops actually occur
STOPS = st.lists(st.text(alphabet="abc\n", min_size=1, max_size=5), max_size=4)


def brute_force(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Scan end positions left to right; at the first one where stops end, the longest (earliest start) wins."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if text[:end].endswith(s)]
        if ending:
            stop = max(ending, key=len)
            return text[: end - len(stop)], stop
    return text, None


def stream(pieces: list[str], stops: list[str]) -> tuple[str, str | None, list[str]]:
    matcher = StopStringMatcher(stops)
    out: list[str] = []
    for piece in pieces:
        fed = matcher.feed(piece)
        out.append(fed.text)
        if fed.stop is not None:
            return "".join(out), fed.stop, out
    out.append(matcher.flush())
    return "".join(out), None, out


@given(SMALL, STOPS)
def test_find_stop_matches_brute_force(text: str, stops: list[str]) -> None:
    kept, stop = brute_force(text, stops)
    match = find_stop(text, stops)
    assert (match is None) == (stop is None)
    if match is not None:
        assert (text[: match.start], len(match.stop)) == (kept, len(stop))


@settings(max_examples=300)
@given(st.data(), SMALL, STOPS)
def test_stream_equals_whole_text_for_any_chunking(data: st.DataObject, text: str, stops: list[str]) -> None:
    pieces = data.draw(chunkings(text))
    kept, stop = brute_force(text, stops)
    out, streamed_stop, _ = stream(pieces, stops)
    assert out == kept
    assert (streamed_stop is None) == (stop is None)
    if stop is not None:
        assert len(streamed_stop) == len(stop) and out + streamed_stop == text[: len(out) + len(stop)]


@given(SMALL, STOPS)
def test_only_a_possible_stop_prefix_is_held(text: str, stops: list[str]) -> None:
    matcher = StopStringMatcher(stops)
    released = ""
    for ch in text:
        fed = matcher.feed(ch)
        if fed.stop is not None:
            return
        released += fed.text
        held = matcher.held
        assert released + held == text[: len(released) + len(held)]
        # Minimal: the held text is a proper prefix of some stop, and nothing longer could be.
        assert held == "" or any(s.startswith(held) and s != held for s in stops)
        assert len(held) == partial_suffix_len(released + held, stops)


def test_stop_split_over_tokens() -> None:
    matcher = StopStringMatcher(["</answer>", "STOP"])
    assert matcher.feed("The result is 4").text == "The result is 4"
    assert matcher.feed("2 </ans").text == "2 "
    assert matcher.held == "</ans"
    fed = matcher.feed("wer> trailing")
    assert (fed.text, fed.stop) == ("", "</answer>")
    assert matcher.feed("more").text == "" and matcher.flush() == ""


def test_false_alarm_is_released() -> None:
    matcher = StopStringMatcher(["</answer>"])
    assert matcher.feed("a </an").text == "a "
    assert matcher.feed("chor>").text == "</anchor>"
    assert matcher.flush() == ""


def test_first_completed_stop_wins() -> None:
    # "bc" completes before "abcd" does, so a stream could never wait for "abcd".
    assert find_stop("xabcd", ["abcd", "bc"]).stop == "bc"
    assert stream(list("xabcd"), ["abcd", "bc"])[:2] == ("xa", "bc")


def test_no_stops_passes_text_through() -> None:
    matcher = StopStringMatcher(["", ""])
    assert matcher.feed("anything").text == "anything"
    assert matcher.flush() == ""
