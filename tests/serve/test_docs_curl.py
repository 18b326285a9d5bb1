"""Every `curl` example of docs/serving.md, read from the page's shell code blocks and run as written with the real
`curl` (through bash, so a pipe in an example is kept) against a live server: each must answer with the HTTP status
the docs give it (200, or the one a trailing `# -> STATUS` comment states, for an example of an error) and what the
docs say, in the route's shape.

The examples are written for the default address, `http://127.0.0.1:8080`; the test puts the live server's address in
its place. `resp-...` stands for an id the reader replaces ("replace the id"): the id of the first response an
earlier example of the same block created (an answer about the response a URL addresses must name that one).
Nothing else is changed, but curl is given `--fail-with-body -S` (an HTTP error is a failed command, which only an
example documented as an error may be), `-w` to report the status, and `--noproxy '*'`. The server is the session's
tiny Qwen3.5 (every `model` name is answered by it): its text is noise, which is enough for the shapes, and it
decodes the examples' tokens several times faster than SmolLM2.

An example whose route has no check below fails the test: a new example needs its expected shape here.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
ORIGIN = "http://127.0.0.1:8080"
RESPONSE_ID = "resp-..."
CURL_TIMEOUT_S = 120.0  # a bound for a loaded 2-core machine
CURL_HTTP_ERROR = 22  # curl's exit status for an HTTP error status under --fail-with-body
EXPECTED_STATUS = re.compile(r"\s#\s*->\s*(\d{3})\b")  # an example's trailing `# -> 400`


@dataclass(frozen=True)
class Example:
    block: int  # which shell block of the page
    command: str  # as the docs write it, continuation lines joined

    @property
    def words(self) -> list[str]:
        return shlex.split(self.command, comments=True)

    @property
    def url(self) -> str:
        (url,) = [w for w in self.words if w.startswith(ORIGIN)]
        return url

    @property
    def body(self) -> dict[str, Any] | None:
        return request_body(self.command)

    @property
    def status(self) -> int:
        """The HTTP status the docs give the example's answer."""
        stated = EXPECTED_STATUS.search(self.command)
        return int(stated.group(1)) if stated else 200

    @property
    def route(self) -> tuple[str, str, bool, int]:
        """(method, path with `{id}` for the placeholder, streamed, status): what the checks are keyed by."""
        words = self.words
        method = words[words.index("-X") + 1] if "-X" in words else "POST" if "-d" in words else "GET"
        path = self.url.removeprefix(ORIGIN).split("?")[0].replace(RESPONSE_ID, "{id}")
        return method, path, bool((self.body or {}).get("stream")), self.status


def request_body(command: str) -> dict[str, Any] | None:
    words = shlex.split(command, comments=True)
    return json.loads(words[words.index("-d") + 1]) if "-d" in words else None


def shell_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```(?:sh|bash|shell)\n(.*?)^```$", markdown, flags=re.MULTILINE | re.DOTALL)


def curl_examples(markdown: str) -> list[Example]:
    examples = []
    for index, block in enumerate(shell_blocks(markdown)):
        commands = re.sub(r"\\\n\s*", "", block).splitlines()  # one line per command
        examples += [Example(index, c.strip()) for c in commands if c.strip().startswith("curl ")]
    return examples


# ---------------------------------------------------------------------------------------------------------------
# What each route answers, as the docs describe it


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name or None, data) per event of an SSE body; comments (`: ping`) are skipped."""
    events = []
    for frame in text.replace("\r\n", "\n").split("\n\n"):
        lines = [line for line in frame.splitlines() if line and not line.startswith(":")]
        if lines:
            name = next((line.removeprefix("event:").strip() for line in lines if line.startswith("event:")), None)
            data = "\n".join(line.removeprefix("data:").strip() for line in lines if line.startswith("data:"))
            events.append((name, data))
    return events


def check_chat(answer: dict, _: dict) -> None:
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["role"] == "assistant"
    assert answer["choices"][0]["finish_reason"] in ("stop", "length") and answer["usage"]["completion_tokens"] > 0


def check_chat_stream(events: list[tuple[str | None, str]], _: dict) -> None:
    *chunks, done = [data for _, data in events]
    assert done == "[DONE]"
    chunks = [json.loads(c) for c in chunks]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    # stream_options.include_usage: the last chunk has the usage and no choices
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert any(choice["finish_reason"] for c in chunks[:-1] for choice in c["choices"])


def check_completion(answer: dict, request: dict) -> None:
    assert answer["object"] == "text_completion" and answer["usage"]["completion_tokens"] <= request["max_tokens"]
    logprobs = answer["choices"][0]["logprobs"]  # the legacy shape, `logprobs: 3` alternatives per token
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == answer["usage"]["completion_tokens"]
    assert all(len(top) == request["logprobs"] for top in logprobs["top_logprobs"])
    assert "".join(logprobs["tokens"]) == answer["choices"][0]["text"]


def check_health(answer: dict, _: None) -> None:
    assert answer == {"status": "ok"}


def check_model_list(answer: dict, _: None) -> None:
    assert answer["object"] == "list" and answer["data"]
    for model in answer["data"]:  # each configured model, with its router status
        assert model["object"] == "model" and model["id"]
        assert model["status"]["value"] in ("loaded", "unloaded", "loading", "failed")


def check_llama_models(answer: dict, _: None) -> None:
    (model,) = answer["models"]  # the loaded model only
    assert set(model) >= {"context", "modalities", "encoding", "memory"} and model["context"] > 0
    assert model["encoding"]["recipe"] and model["encoding"]["tensors"]
    assert answer["data"]  # and the OpenAI list


def check_tokenize(answer: dict, request: dict) -> None:
    tokens = answer["tokens"]  # with_pieces: [{id, piece}]
    assert tokens and all(isinstance(t["id"], int) for t in tokens)
    assert "".join(t["piece"] for t in tokens) == request["content"]


def check_detokenize(answer: dict, _: dict) -> None:
    # The ids are the default model's "Hello world"; any model decodes them to some text of its own.
    assert set(answer) == {"content"} and isinstance(answer["content"], str) and answer["content"]


def check_openai_error(answer: dict, request: dict) -> None:
    error = answer["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["message"] and error["param"] in request  # it names the refused field of the request


def check_template(answer: dict, request: dict) -> None:
    assert request["messages"][0]["content"] in answer["prompt"]


def check_metrics_lines(text: str, _: None) -> None:
    lines = text.splitlines()
    assert lines and all("ninfer_lanes" in line for line in lines)
    assert any(re.fullmatch(r"ninfer_lanes(\{[^}]*\})? \d+(\.\d+)?", line) for line in lines), lines


def check_response(answer: dict, request: dict) -> None:
    assert answer["object"] == "response" and answer["id"].startswith("resp")
    assert answer["status"] in ("completed", "incomplete") and answer["output"]
    assert answer.get("previous_response_id") == request.get("previous_response_id")


def check_response_stream(events: list[tuple[str | None, str]], _: dict) -> None:
    payloads = [json.loads(data) for _, data in events]  # no [DONE] on this route
    assert [name for name, _ in events] == [p["type"] for p in payloads]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert payloads[0]["type"] == "response.created"
    assert payloads[-1]["type"] in ("response.completed", "response.incomplete")


def check_stored_response(answer: dict, _: None) -> None:
    assert answer["object"] == "response" and answer["status"] in ("completed", "incomplete") and answer["output"]


def check_input_items(answer: dict, _: None) -> None:
    assert answer["object"] == "list"
    first = answer["data"][0]  # order=asc: the request's own input first
    assert first["type"] == "message" and first["role"] == "user"
    assert first["content"][0]["text"] == "Say hello."


def check_input_tokens(answer: dict, _: dict) -> None:
    assert answer["object"] == "response.input_tokens" and answer["input_tokens"] > 0


def check_deleted(answer: dict, _: None) -> None:
    assert answer["object"] == "response.deleted" and answer["deleted"] is True and answer["id"].startswith("resp")


def check_message(answer: dict, _: dict) -> None:
    assert answer["type"] == "message" and answer["role"] == "assistant"
    assert answer["content"] and answer["stop_reason"] in ("end_turn", "max_tokens")


def check_message_stream(events: list[tuple[str | None, str]], _: dict) -> None:
    payloads = [json.loads(data) for _, data in events]
    assert [name for name, _ in events] == [p["type"] for p in payloads]
    assert payloads[0]["type"] == "message_start" and payloads[-1]["type"] == "message_stop"
    assert "content_block_delta" in {p["type"] for p in payloads}


def check_count_tokens(answer: dict, _: dict) -> None:
    assert set(answer) == {"input_tokens"} and answer["input_tokens"] > 0


def check_decisions(answer: dict, request: dict) -> None:
    assert list(answer) == ["model", "answers", "usage"] and list(answer["answers"]) == list(request["questions"])
    for key, a in answer["answers"].items():
        assert a["type"] == request["questions"][key]["type"]
        p = [a["noul"]] if a["type"] == "noul" else list(a["probabilities"].values())
        assert all(0 <= x <= 1 for x in p) and (a["type"] == "noul" or abs(sum(p) - 1) < 1e-6)
    assert answer["usage"]["output_tokens"] == 0 and answer["usage"]["input_tokens"] > 0


def check_systemone_422(answer: dict, _: dict) -> None:
    detail = answer["detail"]
    assert detail and all({"type", "loc", "msg", "input"} <= set(d) for d in detail)


def check_rerank(answer: dict, request: dict) -> None:
    results = answer["results"]
    assert len(results) == request.get("top_n", len(request["documents"]))
    assert results[0]["document"]["text"] in request["documents"] and 0 <= results[0]["relevance_score"] <= 1


def check_score(answer: dict, _: dict) -> None:
    assert answer["object"] == "score" and answer["tokens"] and all(t["logprob"] <= 0 for t in answer["tokens"])


# route -> (how the body is read, its check)
JSON, SSE, TEXT = json.loads, sse_events, str
CHECKS: dict[tuple[str, str, bool, int], tuple[Callable[[str], Any], Callable[[Any, Any], None]]] = {
    ("GET", "/health", False, 200): (JSON, check_health),
    ("POST", "/v1/decisions", False, 200): (JSON, check_decisions),
    ("POST", "/v1/systemone", False, 422): (JSON, check_systemone_422),
    ("POST", "/v1/rerank", False, 200): (JSON, check_rerank),
    ("POST", "/v1/score", False, 200): (JSON, check_score),
    ("GET", "/v1/models", False, 200): (JSON, check_model_list),
    ("GET", "/models", False, 200): (JSON, check_llama_models),
    ("POST", "/v1/chat/completions", False, 200): (JSON, check_chat),
    ("POST", "/v1/chat/completions", True, 200): (SSE, check_chat_stream),
    ("POST", "/v1/chat/completions", False, 400): (JSON, check_openai_error),
    ("POST", "/v1/completions", False, 200): (JSON, check_completion),
    ("POST", "/tokenize", False, 200): (JSON, check_tokenize),
    ("POST", "/detokenize", False, 200): (JSON, check_detokenize),
    ("POST", "/apply-template", False, 200): (JSON, check_template),
    ("GET", "/metrics", False, 200): (TEXT, check_metrics_lines),  # piped through grep in the docs
    ("POST", "/v1/responses", False, 200): (JSON, check_response),
    ("POST", "/v1/responses", True, 200): (SSE, check_response_stream),
    ("GET", "/v1/responses/{id}", False, 200): (JSON, check_stored_response),
    ("GET", "/v1/responses/{id}/input_items", False, 200): (JSON, check_input_items),
    ("POST", "/v1/responses/input_tokens", False, 200): (JSON, check_input_tokens),
    ("DELETE", "/v1/responses/{id}", False, 200): (JSON, check_deleted),
    ("POST", "/v1/messages", False, 200): (JSON, check_message),
    ("POST", "/v1/messages", True, 200): (SSE, check_message_stream),
    ("POST", "/v1/messages/count_tokens", False, 200): (JSON, check_count_tokens),
}


def run_curl(command: str, url: str) -> subprocess.CompletedProcess:
    assert command.startswith("curl ")
    # --noproxy: a proxy from the environment must not stand between curl and the loopback server
    # -w: the status, written last on stderr (after any error message of -S)
    runnable = ("curl --fail-with-body -S -w '%{stderr}%{http_code}\\n' --noproxy '*' "
                + command.removeprefix("curl ").replace(ORIGIN, url))
    return subprocess.run(["bash", "-o", "pipefail", "-c", runnable], capture_output=True, text=True,
                          timeout=CURL_TIMEOUT_S)


def test_the_page_has_the_examples_this_test_runs():
    examples = curl_examples(DOC.read_text(encoding="utf-8"))
    assert len(examples) >= 20 and len({e.block for e in examples}) == 5
    assert {e.status for e in examples} == {200, 400, 422}
    for example in examples:
        assert example.command.count(ORIGIN) == 1, f"an example that does not use {ORIGIN}: {example.command}"
        assert example.route in CHECKS, f"no check for {example.route} (from {example.command})"


def test_every_curl_example_answers_as_documented(qwen35_server):
    failures = []
    created: dict[int, str] = {}  # block -> the id of the first response an example of it created
    for example in curl_examples(DOC.read_text(encoding="utf-8")):
        command = example.command
        if RESPONSE_ID in command:
            assert example.block in created, f"{RESPONSE_ID} before any response was created: {command}"
            command = command.replace(RESPONSE_ID, created[example.block])
        result = run_curl(command, qwen35_server.url)
        read, check = CHECKS[example.route]
        try:
            *_, status = result.stderr.splitlines() or [""]
            assert status == str(example.status), f"HTTP status {status}, not {example.status}: {result.stderr}"
            expected_exit = 0 if example.status < 400 else CURL_HTTP_ERROR
            assert result.returncode == expected_exit, f"exit status {result.returncode}: {result.stderr.strip()}"
            answer = read(result.stdout)
            check(answer, request_body(command))
            if RESPONSE_ID in example.url and isinstance(answer, dict) and "id" in answer:  # the response addressed
                assert answer["id"] == created[example.block], "an answer about another response"
        except (AssertionError, ValueError, KeyError, IndexError, TypeError) as exc:
            failures.append(f"{example.command}\n  -> {type(exc).__name__}: {exc}\n  output: {result.stdout[:300]!r}")
            continue
        if isinstance(answer, dict) and answer.get("object") == "response":
            created.setdefault(example.block, answer["id"])
    assert not failures, "docs/serving.md examples that failed:\n" + "\n".join(failures)
