"""Tool calls in generated text: parsing, whole-text and streamed.

Three written forms are recognised, in any mix:

- **Qwen3.5 XML** (what the Qwen3.5 templates teach; vLLM's `qwen3_coder`)::

      <tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>

  One leading and one trailing newline of VALUE belong to the layout and are dropped.
- **Hermes JSON** inside the same block: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
- **Claude Code XML**::

      <function_calls><invoke name="NAME"><parameter name="ARG">VALUE</parameter></invoke></function_calls>

XML argument values are text; they are typed by the tool's JSON schema when one is given (numbers, booleans, null,
objects and arrays are parsed; a value that does not parse stays a string). Without a schema, or for a string
parameter, the value is kept verbatim. The arguments are always emitted as one JSON object text.

Truncation: a call whose closing tags are cut off by the end of the text still yields a call (flagged `truncated`),
as long as its name was complete; an unfinished tag at the end is discarded and reported in the diagnostics with a
bounded snippet. Text outside calls is never lost: a `<tool_call>` block that turns out not to hold a call is given
back as content.

`ToolCallParser` is incremental: feed decoded text as it arrives and it emits `ContentDelta`s and OpenAI-style
`ToolCallDelta`s (the name first, then argument JSON fragments whose concatenation is the arguments text). It never
emits a partial tag as content: text that may be the start of a tag is held until it is decided. String values are
streamed as they arrive (useful for long file contents); typed values are emitted when complete.
`parse_tool_calls` is the whole-text entry point; whatever the chunking, a stream yields the same result.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ninfer.frontend.stop_strings import partial_suffix_len

# VS Code Copilot names MCP tools `activate_fallback_mcp_<server>_<tool>`: longer than OpenAI's 64.
MAX_TOOL_NAME_BYTES = 256
SNIPPET_CHARS = 80

QWEN_XML = "qwen_xml"
HERMES_JSON = "hermes_json"
CLAUDE_XML = "claude_xml"
ALL_FORMATS = (QWEN_XML, HERMES_JSON, CLAUDE_XML)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object text
    format: str
    truncated: bool = False  # closing tags were missing at the end of the text


@dataclass(frozen=True)
class ParseIssue:
    """A diagnostic. `kind` is `truncated`, `malformed` or `unknown_tool`; `snippet` is bounded."""

    kind: str
    message: str
    snippet: str = ""
    discarded_chars: int = 0


@dataclass(frozen=True)
class ToolBlock:
    """A tool-call block taken out of the content: `text[start:end]`, from its opener to its close (or to where
    the text ended, or resumed after a missing close), and how many of the calls it yielded. Every other character
    of the text is content, in order; a block with no call was cut off by the end of the text (a `truncated`
    issue)."""

    start: int
    end: int
    calls: int


@dataclass(frozen=True)
class ToolParseResult:
    content: str
    calls: list[ToolCall]
    issues: list[ParseIssue]
    blocks: list[ToolBlock]  # in text order; what is not content


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """One streamed piece of call `index`: the first carries `name`, the rest extend `arguments`."""

    index: int
    name: str | None = None
    arguments: str = ""


ToolEvent = ContentDelta | ToolCallDelta


def bounded_snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    """`text` cut to about `limit` characters (head and tail kept) for diagnostics and logs."""
    if len(text) <= limit:
        return text
    head = limit * 3 // 4
    tail = limit - head
    return f"{text[:head]}…[{len(text) - limit} chars]…{text[-tail:]}"


# ---------------------------------------------------------------------------------------------------------------
# Schemas and value typing


def tool_parameter_schemas(tools: Iterable[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Tool name -> {parameter name -> JSON schema}, from OpenAI chat (`{"type":"function","function":{...}}`),
    OpenAI Responses (flat) or Anthropic (`input_schema`) tool definitions."""
    result: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        spec = tool.get("function", tool)
        name = spec.get("name") if isinstance(spec, Mapping) else None
        if not isinstance(name, str):
            continue
        params = spec.get("parameters") or spec.get("input_schema") or {}
        props = params.get("properties") if isinstance(params, Mapping) else None
        result[name] = dict(props) if isinstance(props, Mapping) else {}
    return result


def schema_types(schema: Mapping[str, Any] | None) -> frozenset[str]:
    """The JSON types a schema allows (empty when it does not say)."""
    if not isinstance(schema, Mapping):
        return frozenset()
    declared = schema.get("type")
    types = (
        {declared} if isinstance(declared, str) else set(declared) if isinstance(declared, list) else set()
    )
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            types |= schema_types(sub)
    return frozenset(t for t in types if isinstance(t, str))


_NOT_PARSED = object()


def _loads(text: str) -> Any:
    """`json.loads(text)`, or `_NOT_PARSED` when the text is not JSON. Nesting deeper than the decoder's recursion
    limit (a model can write `[[[[...`) is not JSON here either: the parsers never raise on generated text."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_PARSED


def _parse_as(json_type: str, text: str) -> Any:
    if json_type == "null":
        return None if text in ("null", "None") else _NOT_PARSED
    if json_type == "boolean":
        lowered = text.lower()
        return lowered == "true" if lowered in ("true", "false") else _NOT_PARSED
    value = _loads(text)
    wanted: dict[str, tuple[type, ...]] = {
        "integer": (int,),
        "number": (int, float),
        "object": (dict,),
        "array": (list,),
    }
    expected = wanted.get(json_type)
    if expected is None or isinstance(value, bool) or not isinstance(value, expected):
        return _NOT_PARSED
    return value


def coerce_argument(value: str, schema: Mapping[str, Any] | None) -> Any:
    """Type an XML argument value by its schema; strings (and anything that does not parse) stay verbatim."""
    types = schema_types(schema)
    if not types or types == {"string"}:
        return value
    text = value.strip()
    for json_type in ("null", "boolean", "integer", "number", "object", "array"):
        if json_type in types:
            parsed = _parse_as(json_type, text)
            if parsed is not _NOT_PARSED:
                return parsed
    return value


def _is_plain_string(schema: Mapping[str, Any] | None) -> bool:
    return schema_types(schema) in (frozenset(), frozenset({"string"}))


def _json_string_body(text: str) -> str:
    # JSON escaping is per character, so escaping pieces one by one gives the same text as escaping the whole.
    return json.dumps(text, ensure_ascii=False)[1:-1]


_NAME_FORBIDDEN = re.compile(r"[\s<>\"']")


def tool_name_problem(name: str) -> str | None:
    """Why the parsers would never return a call to a tool of this name (None: they would). The server refuses
    such tools up front, so that a call to one cannot silently come back as text."""
    size = len(name.encode())
    if size == 0:
        return "is empty"
    if size > MAX_TOOL_NAME_BYTES:
        return f"is {size} bytes long; tool names may be up to {MAX_TOOL_NAME_BYTES} bytes"
    if _NAME_FORBIDDEN.search(name):
        return "contains whitespace, '<', '>' or a quote"
    return None


def _valid_name(name: str) -> bool:
    return tool_name_problem(name) is None


# ---------------------------------------------------------------------------------------------------------------
# Truncated JSON (Hermes bodies cut off at the end)


_Closers = tuple[str, "_Closers"] | None


def _closing_text(closers: _Closers) -> str:
    text = []
    while closers is not None:
        text.append(closers[0])
        closers = closers[1]
    return "".join(text)


def complete_truncated_json(
    text: str, *, keep_open_string: bool = True, max_attempts: int = 64
) -> tuple[Any, int] | None:
    """Parse a JSON value that may be cut off at the end: close what is open, or cut back to the last element
    boundary. Returns (value, characters of `text` used) or None. With `keep_open_string` a string cut off at the
    end is kept as far as it goes; without, it is dropped with its element."""
    # The open brackets' closers, innermost first, as a linked list (closer, outer) that boundaries share: a
    # snapshot costs nothing, so deeply nested text stays linear.
    closers: _Closers = None
    in_string = escape = False
    boundaries: list[tuple[int, _Closers]] = []  # (cut position, closers open there), in text order
    for i, ch in enumerate(text):
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            closers = ("}" if ch == "{" else "]", closers)
            boundaries.append((i + 1, closers))
        elif ch in "}]" and closers is not None:
            closers = closers[1]
            boundaries.append((i + 1, closers))
        elif ch == ",":
            boundaries.append((i, closers))
    used = len(text) - 1 if escape else len(text)
    attempts: list[tuple[int, str]] = []
    if keep_open_string or not in_string:
        attempts.append((used, ('"' if in_string else "") + _closing_text(closers)))
    attempts += ((cut, _closing_text(open_there)) for cut, open_there in reversed(boundaries[-max_attempts:]))
    for cut, closing in attempts:
        value = _loads(text[:cut] + closing)
        if value is not _NOT_PARSED:
            return value, cut
    return None


# ---------------------------------------------------------------------------------------------------------------
# Streaming parser


@dataclass(frozen=True)
class _XmlDialect:
    format: str
    block_open: str
    block_close: str
    invoke_open: str
    name_end: str
    invoke_close: str
    param_open: str
    param_close: str
    strip_value_newlines: bool


_QWEN = _XmlDialect(
    QWEN_XML,
    "<tool_call>",
    "</tool_call>",
    "<function=",
    ">",
    "</function>",
    "<parameter=",
    "</parameter>",
    strip_value_newlines=True,
)
_CLAUDE = _XmlDialect(
    CLAUDE_XML,
    "<function_calls>",
    "</function_calls>",
    '<invoke name="',
    '">',
    "</invoke>",
    '<parameter name="',
    "</parameter>",
    strip_value_newlines=False,
)


class _State(enum.Enum):
    TEXT = "text"
    BLOCK = "block"  # inside a block, between calls
    JSON_BODY = "json_body"  # inside a `<tool_call>` holding Hermes JSON
    INVOKE_NAME = "invoke_name"
    INVOKE_BODY = "invoke_body"  # inside a call, between parameters
    PARAM_NAME = "param_name"
    PARAM_VALUE = "param_value"
    SKIP_BLOCK = "skip_block"  # a malformed rest of a block that already produced calls


@dataclass
class _Call:
    index: int
    name: str
    format: str
    arguments: list[str] = field(default_factory=list)
    params: int = 0
    truncated: bool = False


class ToolCallParser:
    """Incremental tool-call parser. `feed` text pieces, then `finish`; `result()` gives the whole-text view."""

    def __init__(
        self, tools: Iterable[Mapping[str, Any]] | None = None, formats: Collection[str] = ALL_FORMATS
    ) -> None:
        unknown = set(formats) - set(ALL_FORMATS)
        if unknown:
            raise ValueError(f"unknown tool-call formats: {sorted(unknown)}")
        self._formats = frozenset(formats)
        self._schemas = tool_parameter_schemas(tools) if tools is not None else None
        self._dialects: dict[str, _XmlDialect] = {}
        if QWEN_XML in formats or HERMES_JSON in formats:
            self._dialects[_QWEN.block_open] = _QWEN
        if CLAUDE_XML in formats:
            self._dialects[_CLAUDE.block_open] = _CLAUDE
        self._state = _State.TEXT
        self._dialect = _QWEN
        self._buf = ""
        self._block_raw: list[
            str
        ] = []  # text consumed since the block opened, given back if it holds no call
        self._block_calls = 0
        self._block_start = 0
        self._blocks: list[ToolBlock] = []
        self._fed = 0  # characters fed so far: the text offset of the buffer's end
        self._json_searched = 0
        self._call: _Call | None = None
        self._param_name = ""
        self._param_schema: Mapping[str, Any] | None = None
        self._param_streams = False
        self._value_started = False
        self._value: list[str] = []
        self._out: list[ToolEvent] = []
        self._content: list[str] = []
        self._calls: list[_Call] = []
        self._issues: list[ParseIssue] = []
        self._finished = False

    @property
    def issues(self) -> list[ParseIssue]:
        return list(self._issues)

    def feed(self, piece: str) -> list[ToolEvent]:
        if self._finished:
            raise RuntimeError("ToolCallParser.feed after finish")
        self._buf += piece
        self._fed += len(piece)
        while self._step():
            pass
        return self._take_events()

    def finish(self) -> list[ToolEvent]:
        """End of text: settle what is held, recovering calls whose closing tags are missing."""
        if not self._finished:
            self._finished = True
            self._finish_state()
        return self._take_events()

    def result(self) -> ToolParseResult:
        calls = [ToolCall(c.name, "".join(c.arguments), c.format, c.truncated) for c in self._calls]
        return ToolParseResult("".join(self._content), calls, list(self._issues), list(self._blocks))

    # -- output ----------------------------------------------------------------------------------------------

    def _take_events(self) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        for event in self._out:
            if isinstance(event, ContentDelta) and events and isinstance(events[-1], ContentDelta):
                events[-1] = ContentDelta(events[-1].text + event.text)
            else:
                events.append(event)
        self._out = []
        return events

    def _emit_content(self, text: str) -> None:
        if text:
            self._content.append(text)
            self._out.append(ContentDelta(text))

    def _emit_arguments(self, text: str) -> None:
        assert self._call is not None
        if text:
            self._call.arguments.append(text)
            self._out.append(ToolCallDelta(self._call.index, arguments=text))

    def _issue(self, kind: str, message: str, discarded: str = "") -> None:
        self._issues.append(ParseIssue(kind, message, bounded_snippet(discarded), len(discarded)))

    # -- consuming -------------------------------------------------------------------------------------------

    def _consume(self, n: int) -> str:
        taken, self._buf = self._buf[:n], self._buf[n:]
        self._block_raw.append(taken)
        return taken

    def _open_block(self, dialect: _XmlDialect, start: int) -> None:
        self._dialect = dialect
        self._block_start = start
        self._block_raw = [dialect.block_open]
        self._block_calls = 0
        self._state = _State.BLOCK

    def _give_block_back(self) -> None:
        """The block holds no call after all: its text so far is content; parsing resumes after it."""
        self._emit_content("".join(self._block_raw))
        self._block_raw = []
        self._state = _State.TEXT

    def _close_block(self) -> None:
        """The block ends where the buffer now starts; its text is not content (calls, markup, slips)."""
        self._blocks.append(ToolBlock(self._block_start, self._fed - len(self._buf), self._block_calls))
        self._block_raw = []
        self._state = _State.TEXT

    def _malformed(self, message: str) -> None:
        if self._block_calls == 0 and self._call is None:
            self._give_block_back()
        else:
            self._issue("malformed", message, self._buf)
            self._state = _State.SKIP_BLOCK

    def _start_call(self, name: str, call_format: str) -> None:
        self._call = _Call(len(self._calls), name, call_format)
        self._calls.append(self._call)
        if self._schemas is not None and name not in self._schemas:
            self._issue("unknown_tool", f"the model called {name!r}, which is not among the request's tools")
        self._out.append(ToolCallDelta(self._call.index, name=name))
        self._emit_arguments("{")

    def _end_call(self, truncated: bool = False) -> None:
        assert self._call is not None
        self._emit_arguments("}")
        self._call.truncated = truncated
        self._call = None
        self._block_calls += 1

    # -- states ----------------------------------------------------------------------------------------------

    def _step(self) -> bool:
        """Advance as far as the buffered text decides; True when the state changed and more may follow."""
        handler = {
            _State.TEXT: self._step_text,
            _State.BLOCK: self._step_block,
            _State.JSON_BODY: self._step_json_body,
            _State.INVOKE_NAME: self._step_invoke_name,
            _State.INVOKE_BODY: self._step_invoke_body,
            _State.PARAM_NAME: self._step_param_name,
            _State.PARAM_VALUE: self._step_param_value,
            _State.SKIP_BLOCK: self._step_skip_block,
        }[self._state]
        return handler()

    def _step_text(self) -> bool:
        buf = self._buf
        found = [(buf.find(opener), opener) for opener in self._dialects if opener in buf]
        if found:
            pos, opener = min(found)
            self._emit_content(buf[:pos])
            self._buf = buf[pos + len(opener) :]
            self._open_block(self._dialects[opener], self._fed - len(buf) + pos)
            return True
        hold = partial_suffix_len(buf, tuple(self._dialects))
        self._emit_content(buf[: len(buf) - hold])
        self._buf = buf[len(buf) - hold :]
        return False

    def _step_block(self) -> bool:
        d = self._dialect
        stripped = self._buf.lstrip()
        self._consume(len(self._buf) - len(stripped))
        if not stripped:
            return False
        first = self._block_calls == 0
        xml_ok = d is _CLAUDE or QWEN_XML in self._formats
        json_ok = d is _QWEN and HERMES_JSON in self._formats and first
        if stripped.startswith(d.block_close):
            self._consume(len(d.block_close))
            if first:
                self._give_block_back()  # an empty block holds no call
            else:
                self._close_block()
            return True
        if xml_ok and stripped.startswith(d.invoke_open):
            self._consume(len(d.invoke_open))
            self._state = _State.INVOKE_NAME
            return True
        if json_ok and stripped.startswith("{"):
            self._json_searched = 0
            self._state = _State.JSON_BODY
            return True
        expected = [d.block_close] + ([d.invoke_open] if xml_ok else [])
        if any(tag.startswith(stripped) for tag in expected):
            return False  # a partial tag: wait
        if first:
            self._give_block_back()
        else:
            # Calls done and the model went on writing without closing the block: take the block as closed.
            self._issue("malformed", f"missing {d.block_close} after a tool call")
            self._close_block()
        return True

    def _step_json_body(self) -> bool:
        close = self._dialect.block_close
        end = self._buf.find(close, self._json_searched)
        if end < 0:
            self._json_searched = max(0, len(self._buf) - len(close) + 1)
            return False
        body = self._consume(end)
        self._consume(len(close))
        call = _hermes_call(_loads(body))
        if call is None:
            self._issue("malformed", "a <tool_call> block holds neither XML nor a JSON call", body)
            self._give_block_back()
            return True
        self._emit_hermes(*call)
        self._close_block()
        return True

    def _emit_hermes(self, name: str, arguments: dict[str, Any], truncated: bool = False) -> None:
        self._start_call(name, HERMES_JSON)
        body = json.dumps(arguments, ensure_ascii=False)
        self._emit_arguments(body[1:-1])
        self._end_call(truncated)

    def _read_name(self, name_end: str) -> str | None:
        """A complete, valid name at the front of the buffer (consumed), or None to wait; raises on garbage."""
        end = self._buf.find(name_end)
        if end < 0:
            so_far = self._buf[: len(self._buf) - partial_suffix_len(self._buf, (name_end,))].strip()
            if len(so_far.encode()) > MAX_TOOL_NAME_BYTES or _NAME_FORBIDDEN.search(so_far):
                raise _BadName(self._buf)
            return None
        name = self._buf[:end].strip()
        if not _valid_name(name):
            raise _BadName(self._buf[:end])
        self._consume(end + len(name_end))
        return name

    def _step_invoke_name(self) -> bool:
        try:
            name = self._read_name(self._dialect.name_end)
        except _BadName as bad:
            self._malformed(f"invalid tool name {bounded_snippet(bad.text)!r}")
            return True
        if name is None:
            return False
        self._start_call(name, self._dialect.format)
        self._state = _State.INVOKE_BODY
        return True

    def _step_invoke_body(self) -> bool:
        d = self._dialect
        stripped = self._buf.lstrip()
        self._consume(len(self._buf) - len(stripped))
        if not stripped:
            return False
        if stripped.startswith(d.param_open):
            self._consume(len(d.param_open))
            self._state = _State.PARAM_NAME
            return True
        if stripped.startswith(d.invoke_close):
            self._consume(len(d.invoke_close))
            self._end_call()
            self._state = _State.BLOCK
            return True
        # Tolerated slips: the block closes, or the next call opens, without closing this call.
        if stripped.startswith((d.block_close, d.invoke_open)):
            self._issue("malformed", f"missing {d.invoke_close}")
            self._end_call()
            self._state = _State.BLOCK
            return True
        tags = (d.param_open, d.invoke_close, d.block_close, d.invoke_open)
        if any(tag.startswith(stripped) for tag in tags):
            return False
        # Stray text inside a call: drop it up to the next tag.
        nxt = stripped.find("<", 1)
        stray = self._consume(len(stripped) if nxt < 0 else nxt)
        self._issue("malformed", "unexpected text inside a tool call", stray)
        return True

    def _step_param_name(self) -> bool:
        try:
            name = self._read_name(self._dialect.name_end)
        except _BadName as bad:
            # Dropped up to the next tag, as stray text inside a call is: a bad name seen whole and one seen while
            # it streams in (cut anywhere) then leave the same rest to the call.
            nxt = self._buf.find("<", 1)
            self._issue("malformed", "invalid parameter name", bad.text)
            self._consume(len(self._buf) if nxt < 0 else nxt)
            self._state = _State.INVOKE_BODY
            return True
        if name is None:
            return False
        assert self._call is not None
        schemas = self._schemas.get(self._call.name, {}) if self._schemas is not None else {}
        self._param_name = name
        self._param_schema = schemas.get(name)
        self._param_streams = _is_plain_string(self._param_schema)
        prefix = ("" if self._call.params == 0 else ", ") + json.dumps(name, ensure_ascii=False) + ": "
        self._call.params += 1
        self._value = [prefix]
        if self._param_streams:
            self._emit_arguments(prefix + '"')
        self._value_started = False
        self._state = _State.PARAM_VALUE
        return True

    def _value_piece(self, text: str) -> None:
        if self._param_streams:
            self._emit_arguments(_json_string_body(text))
        else:
            self._value.append(text)

    def _end_value(self) -> None:
        if self._param_streams:
            self._emit_arguments('"')
        else:
            prefix, raw = self._value[0], "".join(self._value[1:])
            value = coerce_argument(raw, self._param_schema)
            self._emit_arguments(prefix + json.dumps(value, ensure_ascii=False))
        self._value = []

    def _step_param_value(self) -> bool:
        d = self._dialect
        if d.strip_value_newlines and not self._value_started:
            if not self._buf:
                return False
            if self._buf.startswith("\n"):
                self._consume(1)
        self._value_started = True
        end = self._buf.find(d.param_close)
        if end >= 0:
            value = self._consume(end)
            self._consume(len(d.param_close))
            if d.strip_value_newlines and value.endswith("\n"):
                value = value[:-1]
            self._value_piece(value)
            self._end_value()
            self._state = _State.INVOKE_BODY
            return True
        closers = ("\n" + d.param_close,) if d.strip_value_newlines else (d.param_close,)
        hold = partial_suffix_len(self._buf, closers)
        self._value_piece(self._consume(len(self._buf) - hold))
        return False

    def _step_skip_block(self) -> bool:
        close = self._dialect.block_close
        end = self._buf.find(close)
        if end < 0:
            keep = partial_suffix_len(self._buf, (close,))
            self._consume(len(self._buf) - keep)
            return False
        self._consume(end + len(close))
        self._close_block()
        return True

    # -- end of text -----------------------------------------------------------------------------------------

    def _finish_state(self) -> None:
        state, buf = self._state, self._buf
        self._buf = ""
        d = self._dialect
        if state is _State.TEXT:
            self._emit_content(buf)
        elif state is _State.PARAM_VALUE:
            # What was held is the value's layout newline and/or the start of `</parameter>`.
            tail = buf[1:] if d.strip_value_newlines and buf.startswith("\n") else buf
            if self._param_streams or "".join(self._value[1:]).strip():
                self._end_value()
                message = "the text ended inside a tool-call argument; the call was closed"
            else:  # a typed value cut off before it began: there is nothing to type, so the argument is left out
                self._value = []
                message = f"the text ended before argument {self._param_name!r} had a value; it was left out"
            self._end_call(truncated=True)
            self._issue("truncated", message, tail)
        elif state in (_State.INVOKE_BODY, _State.PARAM_NAME):
            opened = d.param_open if state is _State.PARAM_NAME else ""
            self._end_call(truncated=True)
            self._issue("truncated", "the text ended inside a tool call; the call was closed", opened + buf)
        elif state is _State.JSON_BODY:
            self._finish_json_body(buf)
        elif state is _State.SKIP_BLOCK or (state is _State.BLOCK and self._block_calls > 0):
            self._issue("truncated", f"the text ended before {d.block_close}", buf)
        elif state is _State.INVOKE_NAME and self._block_calls > 0:
            self._issue("truncated", "the text ended inside a tool name", d.invoke_open + buf)
        else:
            # The text ended before any call of this block had a complete name: nothing can be recovered.
            self._issue(
                "truncated", "the text ended inside an unfinished tool call", "".join(self._block_raw) + buf
            )
        if state is not _State.TEXT:
            self._close_block()

    def _finish_json_body(self, body: str) -> None:
        recovered = complete_truncated_json(body)
        call = _hermes_call(recovered[0]) if recovered is not None else None
        # A name cut off mid-string is not a name: it must survive when the open string is dropped.
        closed_only = complete_truncated_json(body, keep_open_string=False)
        if call is not None and (closed_only is None or _hermes_name(closed_only[0]) != call[0]):
            call = None
        if call is None:
            discarded = "".join(self._block_raw) + body
            self._issue("truncated", "the text ended inside an unfinished JSON tool call", discarded)
            return
        self._emit_hermes(*call, truncated=True)
        assert recovered is not None
        self._issue(
            "truncated", "the text ended inside a JSON tool call; it was completed", body[recovered[1] :]
        )


class _BadName(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _hermes_name(obj: Any) -> str | None:
    return obj.get("name") if isinstance(obj, dict) and isinstance(obj.get("name"), str) else None


def _hermes_call(obj: Any) -> tuple[str, dict[str, Any]] | None:
    """(name, arguments) from a Hermes JSON call object, or None if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not _valid_name(obj["name"]):
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = _loads(arguments)
    if not isinstance(arguments, dict):
        return None
    return obj["name"], arguments


def parse_tool_calls(
    text: str, tools: Iterable[Mapping[str, Any]] | None = None, formats: Collection[str] = ALL_FORMATS
) -> ToolParseResult:
    """Whole-text parse: content outside calls, the calls, and diagnostics."""
    parser = ToolCallParser(tools, formats)
    parser.feed(text)
    parser.finish()
    return parser.result()


def accumulate_events(events: Sequence[ToolEvent]) -> tuple[str, list[tuple[str, str]]]:
    """What a streaming client reconstructs from deltas: (content, [(name, arguments)])."""
    content: list[str] = []
    calls: dict[int, list[str]] = {}
    names: dict[int, str] = {}
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
        else:
            if event.name is not None:
                names[event.index] = event.name
                calls[event.index] = []
            calls[event.index].append(event.arguments)
    return "".join(content), [(names[i], "".join(calls[i])) for i in sorted(calls)]
