"""The media limits as options: one `ninfer-serve` / `ninfer` flag per MediaLimits field, a router config's
per-model `media_limits` object over the command line's values, bad values refused in one line before anything
loads, and a live server started with a limit refusing a request over it (400 naming the part) while one within
it is answered."""

from __future__ import annotations

import base64
import io
import json
from dataclasses import fields
from pathlib import Path

import httpx
import numpy as np
import pytest
from live_servers import serve_parsed_config
from ninfer.cli.generate import add_arguments as add_generate_arguments
from ninfer.cli.media_options import media_limits
from ninfer.cli.serve import _engine_options, build_parser, main
from ninfer.engine import EngineOptions
from ninfer.frontend.media_limits import MediaLimits
from ninfer.serve.router_config import RouterConfigError, parse_config
from PIL import Image


def test_every_limit_is_a_flag_of_both_commands():
    import argparse

    generate = argparse.ArgumentParser()
    add_generate_arguments(generate)
    for parser in (build_parser(), generate):
        values = {f.name: 7 + i for i, f in enumerate(fields(MediaLimits))}
        argv = [a for name, v in values.items() for a in ("--" + name.replace("_", "-"), str(v))]
        args = parser.parse_args(argv)
        assert media_limits(args) == MediaLimits(**values)
    assert media_limits(build_parser().parse_args([])) == MediaLimits()  # no flag: the defaults


def test_the_serve_flags_reach_the_engine_options():
    args = build_parser().parse_args(["--max-images-per-request", "3", "--max-vision-tokens-per-request", "500"])
    assert _engine_options(args).media_limits == MediaLimits(max_images_per_request=3,
                                                             max_vision_tokens_per_request=500)


@pytest.mark.parametrize("value", ["0", "-4"])
def test_a_bad_limit_is_a_one_line_error(value, capsys):
    assert main(["--max-image-pixels", value]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"ninfer-serve: error: --max-image-pixels must be a positive integer, got {value}"


def test_router_config_media_limits_override_the_command_line():
    defaults = EngineOptions(media_limits=MediaLimits(max_video_frames=9, max_images_per_request=5))
    config = parse_config({"models": {"a": {"path": "a.ninfer", "media_limits": {"max_images_per_request": 2}},
                                      "b": {"path": "b.ninfer"}}}, defaults=defaults, source="models.json")
    a, b = config.models
    assert a.options.media_limits == MediaLimits(max_video_frames=9, max_images_per_request=2)
    assert b.options.media_limits == defaults.media_limits


@pytest.mark.parametrize("limits, message", [
    ({"max_pictures": 2}, "models.a.media_limits: unknown limit 'max_pictures' (known: max_image_pixels, "),
    ({"max_images_per_request": 0}, "models.a.media_limits.max_images_per_request must be an integer >= 1, got 0"),
    ({"max_video_frames": True}, "models.a.media_limits.max_video_frames must be an integer >= 1, got true"),
    ([3], "models.a.media_limits must be an object of media limits, got [3]"),
])
def test_router_config_refuses_bad_media_limits(limits, message):
    with pytest.raises(RouterConfigError) as info:
        parse_config({"models": {"a": {"path": "a.ninfer", "media_limits": limits}}}, defaults=EngineOptions(),
                     source="models.json")
    assert str(info.value).startswith("models.json: " + message), str(info.value)


def png_url(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_a_served_limit_refuses_a_request_over_it(pytestconfig, tiny_qwen3_5):
    from live_servers import artifact_for

    path = artifact_for(pytestconfig, tiny_qwen3_5)
    config = parse_config({"models": {"seer": {"path": str(path), "vision": True, "max_context": 1024,
                                               "media_limits": {"max_images_per_request": 1}}}},
                          defaults=EngineOptions(max_concurrency=1), source="test", base=Path("."))
    with serve_parsed_config(config) as server:
        def ask(images: int) -> httpx.Response:
            content = [{"type": "text", "text": "Compare them."}] + [
                {"type": "image_url", "image_url": {"url": png_url(i)}} for i in range(images)]
            return httpx.post(server.url + "/v1/chat/completions", timeout=300, json={
                "model": "seer", "max_tokens": 2, "messages": [{"role": "user", "content": content}]})

        within = ask(1)
        assert within.status_code == 200, within.text
        over = ask(2)
        assert over.status_code == 400
        assert "messages[0].content[2]" in json.dumps(over.json()) and \
            "more than 1 images in one request" in json.dumps(over.json())
