"""TextStream (ninfer.frontend.text): the incremental decoder every streamed answer goes through, against its slow twin
(decode the whole sequence at every step), on fresh random token sequences, with the real tokenizers of the test
models (byte-level BPE) and a SentencePiece-style one (Metaspace + byte fallback: leading spaces, byte tokens)."""

from __future__ import annotations

import random

import live_servers
import pytest
import tokenizers
from ninfer.artifact.reader import read_artifact
from ninfer.frontend.text import Frontend, TextStream

MULTIBYTE = "naïve café ☕ 日本語の文 🦀🇫🇷 Ωμέγα, ḁ̷ and plain words."


class SlowTextStream:
    """Decodes every token so far at each step; gives what is new unless the text ends inside a character."""

    def __init__(self, frontend: Frontend) -> None:
        self.frontend, self.tokens, self.emitted = frontend, [], 0

    def push(self, token_ids: list[int]) -> str:
        self.tokens += token_ids
        text = self.frontend.decode(self.tokens)
        if text.endswith("\ufffd"):
            return ""
        delta, self.emitted = text[self.emitted :], len(text)
        return delta


def _sentencepiece_style() -> Frontend:
    model = tokenizers.models.BPE(unk_token="<unk>", byte_fallback=True)
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    tokenizer.decoder = tokenizers.decoders.Sequence(
        [
            tokenizers.decoders.Replace("▁", " "),
            tokenizers.decoders.ByteFallback(),
            tokenizers.decoders.Fuse(),
            tokenizers.decoders.Strip(" ", 1, 0),  # the leading space of the first word is dropped
        ]
    )
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<s>", *(f"<0x{b:02X}>" for b in range(256))],
        show_progress=False,
    )
    tokenizer.train_from_iterator(
        ["the quick brown fox jumps over the lazy dog " * 20, "café naïve"], trainer
    )
    return Frontend({"tokenizer_json": tokenizer.to_str()}, [])


@pytest.fixture(scope="module")
def frontends(pytestconfig, tiny_qwen3_5, smollm2_gguf) -> dict[str, Frontend]:
    found = {"sentencepiece-style": _sentencepiece_style()}
    for name, source in (("qwen3.5", tiny_qwen3_5), ("smollm2", smollm2_gguf)):
        artifact = read_artifact(live_servers.artifact_for(pytestconfig, source))
        found[name] = Frontend(artifact.frontend, [])
    return found


def _sequences(frontend: Frontend, rng: random.Random) -> list[list[int]]:
    vocab = frontend.tokenizer.get_vocab_size()
    text_ids = frontend.encode(MULTIBYTE)
    byte_ids = frontend.encode("".join(rng.choice(MULTIBYTE) for _ in range(40)))
    noise = [rng.randrange(vocab) for _ in range(60)]
    sources = (text_ids, byte_ids, noise)
    mixed = [source[i % len(source)] for i in range(80) for source in [rng.choice(sources)]]
    return [text_ids, byte_ids, noise, mixed]


@pytest.mark.parametrize("name", ["qwen3.5", "smollm2", "sentencepiece-style"])
def test_incremental_decoding_matches_whole_decoding(frontends, name):
    frontend, rng = frontends[name], random.Random()
    for ids in _sequences(frontend, rng):
        fast, slow = TextStream(frontend), SlowTextStream(frontend)
        fast_text, slow_text, i = "", "", 0
        while i < len(ids):
            step = ids[i : i + rng.choice((1, 1, 1, 2, 3))]  # mostly one token a step, as decoding gives them
            i += len(step)
            fast_text += fast.push(step)
            slow_text += slow.push(step)
            assert fast_text == slow_text
        whole = frontend.decode(ids)
        assert fast_text == whole or (whole.endswith("\ufffd") and whole.startswith(fast_text))


def test_a_character_split_across_tokens_is_held_back_until_complete(frontends):
    frontend = frontends["qwen3.5"]
    ids = frontend.encode("☕𓀀𒀱")
    assert len(ids) > 2  # byte-level BPE splits these characters over several tokens
    stream = TextStream(frontend)
    deltas = [stream.push([t]) for t in ids]
    assert "".join(deltas) == "☕𓀀𒀱"
    assert all("\ufffd" not in d for d in deltas)
