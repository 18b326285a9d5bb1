"""Images through every protocol, by the official SDKs: OpenAI chat `image_url` and Responses `input_image` data
URLs, Anthropic base64 `image` blocks (messages and count_tokens). The usage counts the vision tokens; bad media is
a 400 naming the part; a server without --vision refuses media naming the flag."""

from __future__ import annotations

import base64
import io

import anthropic
import numpy as np
import openai
import pytest
from live_servers import serve_model
from ninfer.artifact.convert import convert
from PIL import Image

MODEL = "tiny-qwen3.5-vision"


@pytest.fixture(scope="module")
def vision_server(tiny_qwen3_5, tmp_path_factory):
    out = tmp_path_factory.mktemp("vision-serve") / "model.ninfer"
    convert(tiny_qwen3_5, out, recipe="bf16", progress=False)
    with serve_model(out, MODEL, max_context=4096, vision=True) as live:  # a video is ~1,100 tokens here
        yield live


def png(width: int, height: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def vision_tokens(server, data: bytes) -> int:
    """Placeholder tokens of an image plus its start / end markers, by the server's own preprocessor."""
    return server.engine.frontend.vision.image(data, part="x").num_tokens + 2


def openai_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def anthropic_client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)


def test_openai_chat_with_an_image_counts_its_tokens(vision_server):
    client = openai_client(vision_server)
    image = png(64, 48, seed=1)
    text = {"type": "text", "text": "What is in the picture?"}

    def ask(content):
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                              max_tokens=3, temperature=0)

    with_image = ask([text, {"type": "image_url", "image_url": {"url": data_url(image)}}])
    without = ask([text])
    assert with_image.choices[0].finish_reason == "length"
    assert with_image.usage.prompt_tokens - without.usage.prompt_tokens == vision_tokens(vision_server, image)


def test_responses_input_image(vision_server):
    image = png(40, 72, seed=2)
    content = [{"type": "input_text", "text": "Describe it."}, {"type": "input_image", "image_url": data_url(image)}]
    response = openai_client(vision_server).responses.create(
        model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=3, temperature=0)
    plain = openai_client(vision_server).responses.create(
        model=MODEL, input=[{"role": "user", "content": content[:1]}], max_output_tokens=3, temperature=0)
    assert response.usage.input_tokens - plain.usage.input_tokens == vision_tokens(vision_server, image)


def test_anthropic_image_block_and_count_tokens(vision_server):
    client = anthropic_client(vision_server)
    image = png(56, 56, seed=3)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                          "data": base64.b64encode(image).decode()}}
    messages = [{"role": "user", "content": [block, {"type": "text", "text": "What is this?"}]}]
    message = client.messages.create(model=MODEL, max_tokens=3, messages=messages)
    counted = client.messages.count_tokens(model=MODEL, messages=messages)
    plain = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": [messages[0]["content"][1]]}])
    assert message.usage.input_tokens == counted.input_tokens
    assert counted.input_tokens - plain.input_tokens == vision_tokens(vision_server, image)


@pytest.mark.parametrize("url, reason", [
    ("data:image/png,notbase64", "not base64-encoded"),
    ("data:image/png;base64,AAAA", "not an image in a supported format"),
    ("https://example.com/cat.png", "remote URLs are not fetched"),
])
def test_bad_image_parts_are_a_400_naming_the_part(vision_server, url, reason):
    content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}]
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client(vision_server).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=2)
    message = str(caught.value)
    assert "messages[0].content[1]" in message
    assert reason in message, message


def test_anthropic_bad_image_names_its_block(vision_server):
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "%%%"}}
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\]\.content\[1\]"):
        anthropic_client(vision_server).messages.create(
            model=MODEL, max_tokens=2,
            messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, block]}])


def test_a_server_without_vision_refuses_media_naming_the_flag(qwen35_server):
    content = [{"type": "image_url", "image_url": {"url": data_url(png(8, 8, seed=4))}}]
    with pytest.raises(openai.BadRequestError, match="--vision") as caught:
        openai_client(qwen35_server).chat.completions.create(
            model="tiny-qwen3.5", messages=[{"role": "user", "content": content}], max_tokens=2)
    assert "messages[0].content[0]" in str(caught.value)


def test_props_and_models_say_whether_the_model_takes_images(vision_server, qwen35_server):
    import httpx
    assert httpx.get(vision_server.url + "/props").json()["modalities"]["vision"] is True
    assert httpx.get(qwen35_server.url + "/props").json()["modalities"]["vision"] is False
    (row,) = httpx.get(vision_server.url + "/models").json()["models"]
    assert row["modalities"] == {"text": True, "image": True, "video": True}


def test_openai_chat_with_a_video_counts_its_groups(vision_server):
    from vision_media import random_video

    video = random_video(np.random.default_rng(5), frames=8, height=32, width=48, fps=4)
    part = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(video).decode()}}
    text = {"type": "text", "text": "What happens?"}
    client = openai_client(vision_server)

    def ask(content):
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                              max_tokens=2, temperature=0)

    with_video, without = ask([part, text]), ask([text])
    decoded = vision_server.engine.frontend.vision.video(video, part="x")
    frontend = vision_server.engine.frontend
    # Per temporal group: its timestamp text, start, pads, end (the outer triple of the template is replaced).
    stamps = sum(len(frontend.encode(f"<{t:.1f} seconds>")) for t in decoded.timestamps)
    expected = decoded.num_tokens + 2 * decoded.grid_thw[0] + stamps
    assert decoded.grid_thw[0] >= 2
    assert with_video.usage.prompt_tokens - without.usage.prompt_tokens == expected
