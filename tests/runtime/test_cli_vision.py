"""`ninfer --image PATH` and `--messages FILE` with image parts (local files) on the tiny Qwen3.5 checkpoint: the
prompt counts the image's vision tokens, and a bad part is a one-line error naming it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ninfer.artifact.convert import convert
from ninfer.engine import Engine, EngineOptions
from PIL import Image

NINFER = [str(Path(sys.executable).parent / "ninfer")]


@pytest.fixture(scope="module")
def artifact(tiny_qwen3_5, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli-vision") / "model.ninfer"
    convert(tiny_qwen3_5, out, recipe="bf16", progress=False)
    return out


def ninfer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NINFER, *args], check=False, capture_output=True, text=True, timeout=600)


def prompt_tokens(stderr: str) -> int:
    return int(re.search(r"prompt (\d+) tokens", stderr)[1])


def test_image_option_and_messages_file_count_the_image(artifact, tmp_path):
    image = tmp_path / "picture.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 72, 3), dtype=np.uint8)).save(image)
    common = ["--max-new", "2", "--temperature", "0", "--threads", "2", "--max-context", "512"]
    plain = ninfer(str(artifact), "--prompt", "What is it?", *common)
    with_image = ninfer(str(artifact), "--prompt", "What is it?", "--image", str(image), *common)
    assert plain.returncode == 0 and with_image.returncode == 0, with_image.stderr
    with Engine.open_sync(artifact, EngineOptions(max_context=256, vision=True)) as engine:
        tokens = engine.frontend.vision.image(image.read_bytes(), part="x").num_tokens + 2  # + start / end
    assert prompt_tokens(with_image.stderr) - prompt_tokens(plain.stderr) == tokens

    messages = tmp_path / "m.json"
    messages.write_text(json.dumps([{"role": "user", "content": [
        {"type": "image", "image": str(image)}, {"type": "text", "text": "What is it?"}]}]))
    from_file = ninfer(str(artifact), "--messages", str(messages), *common)
    assert from_file.returncode == 0, from_file.stderr
    assert prompt_tokens(from_file.stderr) == prompt_tokens(with_image.stderr)


def test_a_missing_image_file_is_a_one_line_error_naming_the_part(artifact, tmp_path):
    result = ninfer(str(artifact), "--prompt", "hi", "--image", str(tmp_path / "none.png"), "--max-new", "1")
    assert result.returncode != 0
    assert "messages[0].content[0]: cannot read" in result.stderr and "Traceback" not in result.stderr
