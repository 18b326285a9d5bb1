"""Random chunkings of a text, for the streaming-equals-whole-text properties of the frontend parsers."""

import itertools

from hypothesis import given
from hypothesis import strategies as st


@st.composite
def chunkings(draw: st.DrawFn, text: str) -> list[str]:
    """`text` cut at random positions (empty pieces included: a token may decode to nothing)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=max(1, len(text)))))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def per_character(text: str) -> list[str]:
    return list(text)


@given(st.text().flatmap(lambda t: st.tuples(st.just(t), chunkings(t))))
def test_chunkings_rejoin_to_the_text(case: tuple[str, list[str]]) -> None:
    text, pieces = case
    assert "".join(pieces) == text
