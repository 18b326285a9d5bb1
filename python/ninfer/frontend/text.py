"""What an artifact says about text: its tokenizer, chat template, special tokens and generation defaults
(`Frontend`), and the incremental detokenizer every streamed answer goes through (`TextStream`)."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import tokenizers

from ninfer import errors
from ninfer.frontend.chat import ChatTemplate, RenderedPrompt
from ninfer.frontend.chat_media import MediaPart, load_media
from ninfer.frontend.media_limits import MediaLimits
from ninfer.frontend.vision import VisionPreprocessor
from ninfer.frontend.vision_prompt import PromptMedia, VisionTokenIds, expand_placeholders, prompt_media

BREAKER_SETS_KEPT = 32  # DRY breaker sets whose token ids a frontend keeps (tokens_containing)


def _tokenizer(source: Any) -> tokenizers.Tokenizer:
    """The artifact's tokenizer.json; a bad one (its checksum can be valid: the writer's input was bad) is an
    ArtifactError, not the tokenizers library's multi-line exception."""
    if not isinstance(source, str):
        raise errors.ArtifactError(f"the artifact's tokenizer is a {type(source).__name__}, not tokenizer.json text")
    try:
        return tokenizers.Tokenizer.from_str(source)
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises plain Exception for every parse error
        reason = " ".join(str(exc).split())[:200]
        raise errors.ArtifactError(f"the artifact's tokenizer.json is not a valid tokenizer: {reason}") from None


class Frontend:
    """What the artifact says about text: tokenizer, chat template, special tokens and generation defaults."""

    def __init__(self, frontend: Mapping[str, Any], eos_token_ids: Sequence[int], *, vision: bool = False,
                 media_limits: MediaLimits | None = None) -> None:
        source = frontend.get("tokenizer_json")
        # Artifacts converted from a checkpoint without a tokenizer take and give token ids only.
        self.tokenizer = None if source is None else _tokenizer(source)
        special = frontend.get("special_tokens") or {}
        self.eos_token_ids: tuple[int, ...] = tuple(special.get("eos") or eos_token_ids)
        self.bos_token_id: int | None = special.get("bos")
        self.generation_defaults: dict[str, Any] = dict(frontend.get("generation_defaults") or {})
        self._token_texts: list[str] | None = None
        # DRY breaker sets -> their token ids, the most recently used BREAKER_SETS_KEPT (an entry can hold most of
        # the vocabulary, and every request may bring a new set); threads of the server's pool share it.
        self._containing: OrderedDict[tuple[str, ...], tuple[int, ...]] = OrderedDict()
        self._containing_lock = threading.Lock()
        templates = frontend.get("chat_templates") or {}
        source = templates.get("default")
        self.chat_template = None if source is None else ChatTemplate(
            source, bos_token=self._token_text(self.bos_token_id),
            eos_token=self._token_text(self.eos_token_ids[0] if self.eos_token_ids else None))
        # Images and video (EngineOptions.vision): the artifact's preprocessing and the tokenizer's vision tokens.
        self.vision: VisionPreprocessor | None = None
        if vision:
            preprocessing = frontend.get("preprocessing") or {}
            self.vision = VisionPreprocessor.from_configs(preprocessing.get("image"), preprocessing.get("video"),
                                                          media_limits)
            self._vision_ids = VisionTokenIds.lookup(self._require_tokenizer().token_to_id)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters of text one token can stand for: the longest vocabulary entry (added tokens
        included). Byte-level and metaspace vocabularies spell each token with at least one character per character
        it decodes to, so a text of N characters has at least N / max_token_chars tokens."""
        tokenizer = self._require_tokenizer()
        return max(1, max(len(piece) for piece in tokenizer.get_vocab(with_added_tokens=True)))

    def _token_text(self, token_id: int | None) -> str:
        if token_id is None or self.tokenizer is None:
            return ""
        return self.tokenizer.id_to_token(token_id) or ""

    def _require_tokenizer(self) -> tokenizers.Tokenizer:
        if self.tokenizer is None:
            raise errors.EngineError("this model's artifact has no tokenizer: send token ids")
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        """Text (a rendered prompt, with its special tokens written out) -> ids; no BOS is added."""
        return self._require_tokenizer().encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._require_tokenizer().decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def tokens_containing(self, pieces: tuple[str, ...]) -> tuple[int, ...]:
        """The ids of the tokens whose text contains one of `pieces` (DRY's sequence breakers), sorted; the
        vocabulary is decoded once per model, and the last BREAKER_SETS_KEPT sets' ids are kept."""
        with self._containing_lock:
            found = self._containing.get(pieces)
            if found is not None:
                self._containing.move_to_end(pieces)
                return found
        if self._token_texts is None:
            tokenizer = self._require_tokenizer()
            ids = [[i] for i in range(tokenizer.get_vocab_size(with_added_tokens=True))]
            self._token_texts = tokenizer.decode_batch(ids, skip_special_tokens=False)
        found = tuple(i for i, text in enumerate(self._token_texts) if any(piece in text for piece in pieces))
        with self._containing_lock:
            self._containing[pieces] = found
            while len(self._containing) > BREAKER_SETS_KEPT:
                self._containing.popitem(last=False)
        return found

    def encode_with_media(self, text: str, parts: Sequence[MediaPart]) -> tuple[list[int], PromptMedia]:
        """A rendered prompt with media placeholders -> ids with each placeholder expanded, and the media the engine
        takes (MediaError naming the first bad part; EngineError without the vision tower)."""
        if self.vision is None:
            raise errors.MediaError(parts[0].part, "this model runs without the vision tower: images and video "
                                                   "need --vision")
        inputs = load_media(parts, self.vision)
        expanded = expand_placeholders(text, inputs, [p.part for p in parts], self._vision_ids, self.encode)
        return expanded.token_ids, prompt_media(expanded, inputs)

    def render(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> RenderedPrompt:
        """Chat messages -> prompt text through the artifact's template (tools, enable_thinking, ...)."""
        if self.chat_template is None:
            raise errors.EngineError("this model has no chat template; send a plain prompt")
        return self.chat_template.render(messages, **options)


class TextStream:
    """Turns a growing list of token ids into text deltas, holding back an incomplete UTF-8 character.

    Incremental: a step decodes only the tokens since the last delta, together with the tokens of that delta as
    context (a decoder may render a token differently at the start of a text, e.g. a SentencePiece word's leading
    space), so a whole generation costs linear, not quadratic, decoding."""

    def __init__(self, frontend: Frontend) -> None:
        self._frontend = frontend
        self._tokens: list[int] = []
        self._context = 0  # tokens[_context:_emitted] produced the last delta: context for the next decode
        self._emitted = 0  # tokens before this index are in the text already given out

    def push(self, token_ids: Sequence[int]) -> str:
        self._tokens.extend(token_ids)
        # Both windows start where the text was complete (a delta never ends inside a character), so their
        # decodes are a prefix of, and the tail of, the whole text's decode.
        context = self._frontend.decode(self._tokens[self._context:self._emitted])
        text = self._frontend.decode(self._tokens[self._context:])
        if text.endswith("\ufffd") or len(text) <= len(context):
            return ""
        self._context, self._emitted = self._emitted, len(self._tokens)
        return text[len(context):]
