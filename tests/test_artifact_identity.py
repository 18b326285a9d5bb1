"""What an artifact says about its model is checked before it runs (issue 18, item 2): its architecture, its special
token ids, its header's reserved bytes and its tokenizer.json. Each refusal is an ArtifactError naming the file; the
`ninfer` CLI prints it as one line and exits 2; `ninfer-serve` answers the requests for that model 503 in the
protocol's own error shape. The artifact is the tiny Qwen3.5 one the serve tests use (real 248k tokenizer), edited
with its manifest re-sealed (tests/artifact_files.py) so that the CRC check does not hide the edit."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import live_servers
import pytest
from artifact_files import patch, rewrite_manifest
from ninfer.artifact.reader import read_artifact
from ninfer.cli.main import main
from ninfer.errors import ArtifactError


@pytest.fixture(scope="module")
def pristine(pytestconfig, tiny_qwen3_5) -> Path:
    return live_servers.artifact_for(pytestconfig, tiny_qwen3_5)


def _edited(pristine: Path, tmp_path: Path, case: str) -> Path:
    copy = tmp_path / "model.ninfer"
    shutil.copyfile(pristine, copy)
    if case == "reserved":
        patch(copy, 60, b"\x01")  # the last of the header's 12 reserved bytes
    else:
        rewrite_manifest(copy, EDITS[case][0])
    return copy


def _set(section: str, key: str, value: object):
    return lambda m: m[section].__setitem__(key, value)


EDITS = {
    "arch": (_set("config", "arch", "gpt9"), "config.arch 'gpt9' is not an architecture this build runs"),
    "eos": (_set("config", "eos_token_ids", [10**9]), "config.eos_token_ids[0] is 1000000000, not a token id"),
    "negative bos": (_set("config", "bos_token_id", -1), "config.bos_token_id is -1, not a token id"),
    "frontend eos": (lambda m: m["frontend"].setdefault("special_tokens", {}).__setitem__("eos", [248320]),
                     "frontend.special_tokens.eos[0] is 248320, not a token id"),
    "reserved": (None, "reserved bytes are not zero"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_the_reader_refuses_what_the_model_cannot_be(pristine, tmp_path, case):
    path = _edited(pristine, tmp_path, case)
    with pytest.raises(ArtifactError) as refusal:
        read_artifact(path)
    assert str(path) in str(refusal.value) and EDITS[case][1] in str(refusal.value)


def test_the_pristine_artifact_reads(pristine):
    read_artifact(pristine).close()


def _bad_tokenizer(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "model.ninfer"
    shutil.copyfile(pristine, copy)
    rewrite_manifest(copy, lambda m: m["frontend"].__setitem__("tokenizer_json", '{"model": {"type": "nonsense"}}'))
    return copy


@pytest.mark.parametrize("case", ["arch", "bad tokenizer"])
def test_the_cli_says_it_in_one_line_with_status_2(pristine, tmp_path, capsys, case):
    path = _bad_tokenizer(pristine, tmp_path) if case == "bad tokenizer" else _edited(pristine, tmp_path, case)
    assert main([str(path), "--prompt", "hi", "--max-new", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "Traceback" not in err, err
    expected = "tokenizer.json is not a valid tokenizer" if case == "bad tokenizer" else EDITS["arch"][1]
    assert expected in err


def test_the_server_answers_503_in_each_protocols_shape(pristine, tmp_path):
    path = _bad_tokenizer(pristine, tmp_path)
    with live_servers.serve_router({"models": {"bad": {"path": str(path)}}}) as live:
        chat = httpx.post(f"{live.url}/v1/chat/completions", timeout=60,
                          json={"model": "bad", "messages": [{"role": "user", "content": "hi"}]})
        messages = httpx.post(f"{live.url}/v1/messages", timeout=60,
                              json={"model": "bad", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 503 and messages.status_code == 503
    error = chat.json()["error"]
    assert error["type"] == "unavailable_error" and "tokenizer.json is not a valid tokenizer" in error["message"]
    assert "\n" not in error["message"] and "Traceback" not in error["message"]
    body = messages.json()
    assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
    assert "tokenizer.json is not a valid tokenizer" in body["error"]["message"]
