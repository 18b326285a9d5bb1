"""Structured output: JSON Schema / JSON object answers enforced by a per-step token mask.

Requests name a format in their protocol's own field (OpenAI chat `response_format`, Responses `text.format`,
Anthropic `output_format`); the parsers below turn each into one `OutputFormat`. `compile_grammar` checks the schema
and compiles it, refusing what the grammar library cannot enforce with a message that names the features (the
routes answer 400). `TokenConstraint` is the per-request state the engine consults before sampling each token: it
writes a bitmask of the tokens that keep the answer valid.

The grammar library is llguidance (PyPI `llguidance`): it has no dependencies (xgrammar needs torch, triton and
transformers, and serving must not need torch), it builds its token trie straight from the `tokenizer.json` text the
artifact already carries, and it computes a mask in well under a millisecond for JSON grammars. Building its
tokenizer index costs seconds for a 248k vocabulary, so it is built once per model (`grammar_tokenizer`) and shared.

The mask is active only after reasoning ends: while a prompt leaves a think block open, the model reasons freely and
the constraint watches the decoded text for `</think>`; from then on every token is masked. Whitespace before the
JSON value is allowed (templates put newlines after `</think>`), and whitespace inside it is bounded, so a model that
favours whitespace cannot run to max_tokens without writing the value.
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import llguidance
import numpy as np
from msgspec import Meta

from ninfer.errors import EngineError
from ninfer.frontend.reasoning import ReasoningParser
from ninfer.serve.errors import InvalidRequestError

if TYPE_CHECKING:
    from ninfer.engine import Engine
    from ninfer.frontend.text import Frontend

GRAMMAR_LIBRARY = "llguidance"
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
# Whitespace the grammar allows between JSON tokens, and before the value.
_INNER_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,16}"
_LEADING_WHITESPACE = r"/[ \t\r\n]{0,16}/"


@dataclass(frozen=True)
class OutputFormat:
    """A requested answer shape. `kind` is json_schema or json_object (then `schema` is `{"type": "object"}`)."""

    kind: str
    schema: Mapping[str, Any]
    name: str | None = None
    strict: bool | None = None  # recorded for the response; the mask enforces the schema either way


def _require_mapping(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidRequestError(f"{field} must be an object", param=field)
    return value


def _format_from(kind: Any, schema: Any, name: Any, strict: Any, field: str) -> OutputFormat | None:
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return OutputFormat("json_object", JSON_OBJECT_SCHEMA)
    if kind != "json_schema":
        raise InvalidRequestError(
            f"{field}.type must be 'text', 'json_object' or 'json_schema', not {kind!r}",
            param=f"{field}.type",
        )
    schema = _require_mapping(schema, f"{field}.schema")
    if name is not None and not isinstance(name, str):
        raise InvalidRequestError(f"{field}.name must be a string", param=f"{field}.name")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequestError(f"{field}.strict must be a boolean", param=f"{field}.strict")
    return OutputFormat("json_schema", schema, name, strict)


# The request fields the parsers below read, as the OpenAPI document gives them (msgspec types each as an object;
# the parsers refuse the rest, and compile_grammar the schemas llguidance cannot enforce).
_PLAIN = {"properties": {"type": {"enum": ["text", "json_object"]}}}  # no type: no constraint
_NAMED = {"name": {"type": "string"}, "strict": {"type": "boolean"}}


def _json_schema(fields: dict[str, Any]) -> dict[str, Any]:
    return {"required": ["type", "schema"], "properties": {"type": {"const": "json_schema"},
                                                           "schema": {"type": "object"}, **fields}}


_FLAT_FORMAT = {"anyOf": [_PLAIN, _json_schema(_NAMED)]}
ResponseFormat = Annotated[dict[str, Any], Meta(extra_json_schema={"anyOf": [_PLAIN, {
    "required": ["type", "json_schema"], "properties": {"type": {"const": "json_schema"}, "json_schema": {
        "type": "object", "required": ["schema"], "properties": {"schema": {"type": "object"}, **_NAMED}}}}]})]
TextConfig = Annotated[dict[str, Any], Meta(extra_json_schema={"properties": {"format": {
    "anyOf": [{"type": "null"}, {"type": "object", **_FLAT_FORMAT}]}}})]  # Responses `text`
OutputFormatField = Annotated[dict[str, Any], Meta(extra_json_schema={"anyOf": [_PLAIN, _json_schema({})]})]


def chat_response_format(value: Any) -> OutputFormat | None:
    """OpenAI chat `response_format`: {type: text | json_object | json_schema, json_schema: {name, schema, strict}}."""
    if value is None:
        return None
    value = _require_mapping(value, "response_format")
    spec = value.get("json_schema")
    if value.get("type") == "json_schema":
        spec = _require_mapping(spec, "response_format.json_schema")
    else:
        spec = {}
    return _format_from(
        value.get("type"),
        spec.get("schema"),
        spec.get("name"),
        spec.get("strict"),
        "response_format.json_schema" if spec else "response_format",
    )


def responses_text_format(text: Any) -> OutputFormat | None:
    """OpenAI Responses `text`: {format: {type: text | json_object | json_schema, name, schema, strict}}."""
    if text is None:
        return None
    fmt = _require_mapping(text, "text").get("format")
    if fmt is None:
        return None
    fmt = _require_mapping(fmt, "text.format")
    return _format_from(fmt.get("type"), fmt.get("schema"), fmt.get("name"), fmt.get("strict"), "text.format")


def anthropic_output_format(value: Any) -> OutputFormat | None:
    """Anthropic `output_format`: {type: json_schema, schema}."""
    if value is None:
        return None
    value = _require_mapping(value, "output_format")
    return _format_from(value.get("type"), value.get("schema"), None, None, "output_format")


def _with_whitespace_limit(schema: Mapping[str, Any]) -> dict[str, Any]:
    # `x-guidance` carries llguidance's compile options inside the schema; a client's own is replaced, not merged.
    # A shallow copy: only the top level changes, and a deep one of a 10 MB schema takes seconds of CPU (with the
    # GIL held through its garbage collections) before llguidance refuses the schema as too large.
    bounded = dict(schema)
    bounded["x-guidance"] = {"whitespace_pattern": _INNER_WHITESPACE}
    return bounded


def check_schema(schema: Any, field: str) -> None:
    """The one check of a JSON Schema a request carries, whether it constrains the output (`response_format`,
    `text.format`, `output_format`) or describes a tool's parameters: an object that llguidance accepts."""
    compile_grammar(OutputFormat("json_schema", _require_mapping(schema, field)), field)


def compile_grammar(fmt: OutputFormat, field: str) -> str:
    """The llguidance grammar for `fmt`; InvalidRequestError naming the schema features it cannot enforce."""
    # As JSON text: llguidance reads a str without holding the GIL as long as it does converting a dict (a large
    # schema is compiled in a worker thread, and the event loop needs the GIL meanwhile).
    schema = json.dumps(_with_whitespace_limit(fmt.schema))
    try:
        # Validated on its own first: its messages name the unsupported keywords without the wrapper's source.
        error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_json_schema(schema))
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(f"{field} is not a usable JSON Schema: {exc}", param=field) from exc
    if error:
        raise InvalidRequestError(
            f"{field} uses JSON Schema features that structured output cannot enforce: {error}", param=field
        )
    lark = f"start: {_LEADING_WHITESPACE} answer\nanswer: %json {schema}\n"
    return llguidance.LLMatcher.grammar_from_lark(lark)


# ---------------------------------------------------------------------------------------------------------------
# The tokenizer index, once per model

_tokenizers: weakref.WeakKeyDictionary[Frontend, dict[int, llguidance.LLTokenizer]] = (
    weakref.WeakKeyDictionary()
)
_tokenizers_lock = threading.Lock()


def grammar_tokenizer(frontend: Frontend, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's index of the model's vocabulary (seconds to build: call from a worker thread; cached).
    `vocab_size` is the model's logits width, which may exceed the tokenizer's (padding rows are never allowed)."""
    if frontend.tokenizer is None:
        raise EngineError("structured output needs the model's tokenizer, and this artifact has none")
    with _tokenizers_lock:  # one build at a time; a second request for the same model waits for the first
        per_model = _tokenizers.setdefault(frontend, {})
        if vocab_size not in per_model:
            per_model[vocab_size] = llguidance.LLTokenizer(
                frontend.tokenizer.to_str(), n_vocab=vocab_size, eos_token=list(frontend.eos_token_ids)
            )
        return per_model[vocab_size]


async def build_constraint(
    engine: Engine, fmt: OutputFormat, field: str, *, starts_in_reasoning: bool
) -> TokenConstraint:
    """The request's TokenConstraint (refusing, with InvalidRequestError, a schema the grammar cannot enforce), to
    pass with its engine Request. The model's tokenizer index is built in a worker thread the first time."""
    grammar = await asyncio.to_thread(compile_grammar, fmt, field)  # seconds for a large schema: off the event loop
    tokenizer = await asyncio.to_thread(grammar_tokenizer, engine.frontend, engine.info.vocab_size)
    return TokenConstraint(grammar, tokenizer, engine.frontend, starts_in_reasoning=starts_in_reasoning)


# ---------------------------------------------------------------------------------------------------------------
# The per-request constraint


def mask_words(vocab_size: int) -> int:
    """Length of a token bitmask in 32-bit words: bit `t % 32` of word `t // 32` allows token t."""
    return (vocab_size + 31) // 32


def allowed_token_ids(mask: np.ndarray) -> np.ndarray:
    """The token ids a bitmask allows, ascending."""
    bits = np.unpackbits(np.ascontiguousarray(mask, dtype="<u4").view(np.uint8), bitorder="little")
    return np.flatnonzero(bits)


def apply_mask(logits: np.ndarray, mask: np.ndarray) -> None:
    """Sets the logits of disallowed tokens to -inf, in place (the numpy form of what the engine does)."""
    keep = np.zeros(logits.shape[-1], dtype=bool)
    allowed = allowed_token_ids(mask)
    keep[allowed[allowed < logits.shape[-1]]] = True
    logits[..., ~keep] = -np.inf


class TokenConstraint:
    """One request's grammar state. The engine calls `fill_next_mask` before sampling each token of the request,
    passing the tokens sampled since the previous call; it must not be shared between requests."""

    def __init__(
        self,
        grammar: str,
        tokenizer: llguidance.LLTokenizer,
        frontend: Frontend,
        *,
        starts_in_reasoning: bool,
    ) -> None:
        self._matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self._matcher.is_error():
            raise EngineError(f"structured output grammar does not compile: {self._matcher.get_error()}")
        self._tokenizer = tokenizer
        self._frontend = frontend
        self._eos = [t for t in frontend.eos_token_ids if t < tokenizer.vocab_size]
        self.vocab_size = tokenizer.vocab_size
        # Reasoning still open: tokens are watched, not masked. Only `</think>` ends it here: a tool-call opener
        # inside the reasoning is not an answer, so it must not switch the grammar on.
        self._reasoning: ReasoningParser | None = (
            ReasoningParser(starts_in_reasoning=True, implicit_end_markers=())
            if starts_in_reasoning
            else None
        )
        self._reasoning_tokens: list[int] = []
        self._reasoning_text_len = 0
        self._reasoning_held = False  # the reasoning text ends inside a UTF-8 character: not yet fed
        self._may_end_reasoning: dict[int, bool] = {}  # per token id: its bytes hold a `>` (see fill_draft_masks)
        self.error: str | None = None

    @property
    def active(self) -> bool:
        """True once the answer has started (reasoning over): every later token is masked."""
        return self._reasoning is None

    @property
    def accepting(self) -> bool:
        """The answer so far is a complete value of the schema."""
        return self.active and self._matcher.is_accepting()

    def fill_next_mask(self, new_token_ids: Sequence[int], mask: np.ndarray) -> bool:
        """Advance by `new_token_ids`, then write the next step's allowed tokens into `mask` (uint32, C-contiguous,
        `mask_words(vocab_size)` long). Returns False when this step is not constrained (mask left untouched)."""
        if (
            mask.dtype != np.uint32
            or mask.ndim != 1
            or not mask.flags.c_contiguous
            or mask.size != mask_words(self.vocab_size)
        ):
            raise ValueError(
                f"token mask must be a contiguous uint32 vector of {mask_words(self.vocab_size)} words"
            )
        pending = self._watch_reasoning(new_token_ids) if self._reasoning is not None else list(new_token_ids)
        if self._reasoning is not None:
            return False
        if pending and self.error is None and not self._matcher.consume_tokens(pending):
            self.error = self._matcher.get_error() or "a sampled token broke the grammar"
        if self.error is not None:
            # The state is unusable: allow only end-of-sequence so the generation stops here.
            mask[:] = 0
            for token in self._eos:
                mask[token >> 5] |= np.uint32(1 << (token & 31))
            return True
        self._matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        return True

    def fill_draft_masks(self, new_token_ids: Sequence[int], drafts: Sequence[int], masks: np.ndarray) -> list[bool]:
        """fill_next_mask for a speculative round: advance by `new_token_ids` (committed), then write into masks[i] the
        mask after drafts[:i] (hypothetical: the grammar is left where new_token_ids put it). Returns one flag per row
        it speaks for, from the first (True: masks[i] applies, False: unconstrained), stopping at the first draft the
        grammar forbids (its row's mask is given: the correction is drawn under it) and where the grammar stops, or,
        while reasoning is open, at the first draft that might end it. `masks` is [len(drafts) + 1, mask_words]."""
        if masks.ndim != 2 or masks.shape[0] < len(drafts) + 1:
            raise ValueError(f"a round of {len(drafts)} drafts needs {len(drafts) + 1} mask rows")
        if not self.fill_next_mask(new_token_ids, masks[0]):
            return [False] * (1 + self._drafts_inside_reasoning(drafts))
        if self.error is not None:
            return [True]
        valid = self._matcher.validate_tokens(list(drafts))  # a draft past these is forbidden by the mask before it
        rows, consumed = 1, 0
        for token in drafts[:valid]:
            self._matcher.consume_token(token)
            consumed += 1
            if self._matcher.is_stopped():  # (an end-of-sequence draft: nothing is drawn after it)
                break
            self._matcher.unsafe_compute_mask_ptr(masks[rows].ctypes.data, masks[rows].nbytes)
            rows += 1
        if consumed:
            self._matcher.rollback(consumed)
        return [True] * rows

    def _drafts_inside_reasoning(self, drafts: Sequence[int]) -> int:
        """How many leading drafts surely leave the reasoning open: the block ends only when the `>` of `</think>`
        arrives (nothing else ends it here), so a token whose bytes hold no `>` cannot end it, unless the text so
        far ends inside a character (then the next token's text completes what was held back)."""
        if self._reasoning_held:
            return 0
        for n, token in enumerate(drafts):
            may_end = self._may_end_reasoning.get(token)
            if may_end is None:
                may_end = self._may_end_reasoning[token] = b">" in self._tokenizer.decode_bytes([token])
            if may_end:
                return n
        return len(drafts)

    def _watch_reasoning(self, token_ids: Sequence[int]) -> list[int]:
        """Feeds reasoning tokens to the splitter; once `</think>` is seen, returns the answer tokens that came in
        the same step (re-tokenized from the text after the tag, which is what the grammar must then accept)."""
        assert self._reasoning is not None
        self._reasoning_tokens.extend(token_ids)
        text = self._frontend.decode(self._reasoning_tokens, skip_special_tokens=False)
        self._reasoning_held = text.endswith("\ufffd")
        if self._reasoning_held:
            return []  # an incomplete UTF-8 character: wait for the rest
        delta = self._reasoning.feed(text[self._reasoning_text_len :])
        self._reasoning_text_len = len(text)
        if not self._reasoning.reasoning_ended:
            return []
        self._reasoning = None
        self._reasoning_tokens = []
        return self._tokenizer.tokenize_str(delta.content) if delta.content else []
