"""The real pinned llama-ui, in headless Chromium, against a live ninfer router (SmolLM2 as two models): send a
message and see the streamed answer, stop a generation, switch models and see the status change, reload mid-stream
and see the stream resume, see a long prompt's progress; and the dashboard shows live slot state and the prefix
cache's figures. Screenshots go to docs/."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import live_servers
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs"
# Bounds, not delays (every wait ends as soon as its condition holds): an answer, with a model load or swap before it,
# in a browser on a loaded 2-core machine; and what takes a second or two when idle (the dashboard polls once a second,
# a stopped generation frees its lane at once).
ANSWER_TIMEOUT_MS = 180_000
SETTLE_MS = 30_000
PAGE_TIMEOUT_MS = 60_000  # every other page action (Playwright's default is 30 s)
ASSISTANT = '[aria-label="Assistant message with actions"]'
ANSWER = f"{ASSISTANT} .markdown-content"  # the answer text alone, without the "Processing..." and model chrome
# llama-ui sends no max_tokens by default and SmolLM2 samples: an answer could run to the end of the context, and a
# sampled answer need not say what the test looks for. The UI's own settings (localStorage, as its settings dialog
# saves them) bound every answer and make it greedy.
UI_SETTINGS = {"max_tokens": 160, "temperature": 0}


def chat_context(browser, settings: dict = UI_SETTINGS, width: int = 1280):
    """A browser context whose llama-ui starts with these settings (unless a test saved others)."""
    context = browser.new_context(viewport={"width": width, "height": 860})
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    context.add_init_script(f"localStorage.getItem('LlamaUi.config') || "
                            f"localStorage.setItem('LlamaUi.config', {json.dumps(json.dumps(settings))})")
    return context


@pytest.fixture
def page(browser, ui_server):
    context = chat_context(browser)
    page = context.new_page()
    page.goto(ui_server.url + "/")
    yield page
    context.close()


def statuses(server) -> dict[str, str]:
    rows = httpx.get(server.url + "/v1/models", timeout=30).json()["data"]
    return {r["id"]: r["status"]["value"] for r in rows}


def choose_model(page, name: str, models: tuple[str, ...] = ("alpha", "beta")) -> None:
    # The chat form's model selector comes after the messages, whose own model badges are buttons too: take the last.
    shown = ", ".join(f"button:has-text('{m}')" for m in models)
    page.get_by_role("button", name="Select model").or_(page.locator(shown)).last.click()
    page.get_by_text(name, exact=True).last.click()


def wait_until(condition: Callable[[], bool], failure: Callable[[], str], timeout_s: float = SETTLE_MS / 1000,
               pause: Callable[[], None] = lambda: time.sleep(0.1)) -> None:
    """Returns once condition() holds; fails with failure() if it still does not after timeout_s."""
    if not live_servers.wait_until(condition, timeout_s, pause):
        pytest.fail(failure())


def wait_for_statuses(server, expected: dict[str, str], timeout_s: float = 60) -> None:
    wait_until(lambda: statuses(server) == expected,
               lambda: f"model statuses stayed {statuses(server)}, expected {expected}", timeout_s,
               lambda: time.sleep(0.5))


def send(page, text: str) -> None:
    box = page.locator("textarea").first
    box.fill(text)
    box.press("Enter")


def assistant_text(page) -> str:
    return page.locator(ANSWER).last.inner_text()


def watch_load_percents(page) -> Callable[[], list[float]]:
    """Notes every width llama-ui gives its model load bars (the thin bar under the model selector while the chosen
    model loads, its width the load's progress from /models/sse); the returned function stops watching and gives the
    percents in the order shown."""
    page.evaluate("""() => {
        window.loadPercents = [];
        window.loadWatch = new MutationObserver(() => {
            for (const bar of document.querySelectorAll('div.animate-pulse.bg-primary[style*="width"]')) {
                const percent = parseFloat(bar.style.width);
                if (percent !== window.loadPercents.at(-1)) window.loadPercents.push(percent);
            }
        });
        window.loadWatch.observe(document.body, {subtree: true, childList: true, attributes: true});
    }""")
    return lambda: page.evaluate("() => { window.loadWatch.disconnect(); return window.loadPercents; }")


def test_send_a_message_and_see_the_streamed_answer(page, ui_server) -> None:
    bodies: list[dict] = []
    page.on("request", lambda r: bodies.append(r.post_data_json) if r.url.endswith("/v1/chat/completions") else None)
    assert httpx.get(ui_server.url + "/unload", timeout=30).text == "OK"  # this test sees alpha load
    wait_for_statuses(ui_server, {"alpha": "unloaded", "beta": "unloaded"})
    load_percents = watch_load_percents(page)
    choose_model(page, "alpha")  # llama-ui loads the model it is given to choose
    send(page, "What is the capital of France? Answer in one sentence.")
    page.locator(ASSISTANT).last.wait_for(timeout=ANSWER_TIMEOUT_MS)
    page.wait_for_function(f"document.querySelector('{ASSISTANT}')?.innerText.includes('Paris')",
                           timeout=ANSWER_TIMEOUT_MS)
    page.get_by_role("button", name="Stop generation").wait_for(state="hidden", timeout=ANSWER_TIMEOUT_MS)
    page.screenshot(path=str(SCREENSHOTS / "webui-chat.png"))
    # While alpha loaded, the model selector showed the load's progress growing (the bar drops to 0 once loaded).
    percents = load_percents()
    peak = percents.index(max(percents))
    assert 0 < percents[peak] < 100, percents
    assert percents[:peak + 1] == sorted(percents[:peak + 1]) and set(percents[peak + 1:]) <= {0}, percents
    assert statuses(ui_server)["alpha"] == "loaded"
    # The settings reached the request (a greedy answer), and llama-ui arms the reasoning control as it always does.
    (body,) = bodies
    assert body["temperature"] == 0 and body["max_tokens"] == 160 and body["reasoning_control"] is True

    # The answer renders as it streams: a long one is seen growing while its request is still open.
    ended = ended_chat_requests(page)
    send(page, "Write a very long story about a lighthouse keeper and the sea, with many chapters.")
    growing = f"([...document.querySelectorAll('{ANSWER}')].pop()?.innerText || '').length"
    page.wait_for_function(f"{growing} > 0 && document.querySelectorAll('{ASSISTANT}').length == 2",
                           timeout=ANSWER_TIMEOUT_MS)
    first = len(assistant_text(page))
    page.wait_for_function(f"{growing} > {first + 20}", timeout=ANSWER_TIMEOUT_MS)
    assert not ended, "the answer was only shown once its stream had ended"
    page.get_by_role("button", name="Stop generation").click()
    wait_until(lambda: not any(s["is_processing"] for s in httpx.get(ui_server.url + "/slots?model=alpha").json()),
               lambda: "the stopped generation still holds its lane")


def ui_statuses(page) -> dict[str, str]:
    """The models' states as llama-ui's model selector shows them: a green dot for loaded, a spinner while loading,
    a red mark for failed, a grey dot otherwise. Opens the selector and closes it again."""
    page.get_by_role("button", name="Select model").or_(page.locator("button:has-text('alpha'), "
                                                                   "button:has-text('beta')")).last.click()
    options = page.get_by_role("option")
    options.first.wait_for()
    shown = options.evaluate_all("""options => Object.fromEntries(options.map(o => [o.innerText.trim(),
        o.querySelector('.bg-green-500') ? 'loaded' : o.querySelector('.animate-spin') ? 'loading'
        : o.querySelector('.text-red-500') ? 'failed' : 'unloaded']))""")
    page.keyboard.press("Escape")
    options.first.wait_for(state="hidden")
    return shown


def wait_for_ui_statuses(page, expected: dict[str, str], timeout_s: float = 60) -> None:
    last: dict[str, str] = {}

    def shown() -> bool:
        last.update(ui_statuses(page))
        return last == expected

    wait_until(shown, lambda: f"llama-ui showed {last}, expected {expected}", timeout_s, lambda: time.sleep(0.5))


def engine_tokens_generated(server) -> int:
    """Tokens the resident engine generated so far (the dashboard's engine stats)."""
    return httpx.get(server.url + "/dashboard/state", timeout=30).json()["engine"]["tokens_generated"]


def ended_chat_requests(page) -> list:
    """The page's chat requests that have ended (finished, or failed as an aborted fetch does), as they end."""
    ended: list = []

    def note(request) -> None:
        if request.url.endswith("/v1/chat/completions"):
            ended.append(request)

    page.on("requestfinished", note)
    page.on("requestfailed", note)
    return ended


def test_stop_a_generation(page, ui_server) -> None:
    # alpha resident before the answer starts, so that its engine's token count measures this answer alone.
    httpx.post(ui_server.url + "/models/load", json={"model": "alpha"}, timeout=30)
    wait_for_statuses(ui_server, {"alpha": "loaded", "beta": "unloaded"}, timeout_s=ANSWER_TIMEOUT_MS / 1000)
    tokens_before = engine_tokens_generated(ui_server)
    ended = ended_chat_requests(page)
    choose_model(page, "alpha")
    send(page, "Write a very long story about a lighthouse keeper and the sea, with many chapters.")
    stop = page.get_by_role("button", name="Stop generation")
    stop.wait_for(timeout=ANSWER_TIMEOUT_MS)
    page.wait_for_function(f"([...document.querySelectorAll('{ANSWER}')].pop()?.innerText || '').length > 20",
                           timeout=ANSWER_TIMEOUT_MS)
    stop.click()
    stop.wait_for(state="hidden", timeout=SETTLE_MS)
    stopped_at = assistant_text(page)
    # The server freed the lane: nothing is processing any more.
    wait_until(lambda: not any(s["is_processing"] for s in httpx.get(ui_server.url + "/slots?model=alpha").json()),
               lambda: "the stopped generation still holds its lane")
    # The generation was cut short: run to its end, it makes the answer's full max_tokens (a greedy "very long
    # story" does not end sooner). A count, not a time: however late the stop lands on a loaded machine, it holds.
    generated = engine_tokens_generated(ui_server) - tokens_before
    assert 0 < generated < UI_SETTINGS["max_tokens"]
    # llama-ui saves the partial answer before it aborts its request, so chunks received meanwhile still render after
    # the Stop button hid. Once the request has ended no chunk can arrive; the text then settles, extending what was
    # shown.
    wait_until(lambda: bool(ended), lambda: "the stopped chat request never ended",
               pause=lambda: page.wait_for_timeout(100))
    settled = settled_text(page)
    assert settled.startswith(stopped_at)
    page.wait_for_timeout(1000)
    assert assistant_text(page) == settled  # no more text arrives (no resumed stream, say)


def settled_text(page, quiet_s: float = 1.0) -> str:
    """The answer once it has not changed for quiet_s."""
    deadline = time.monotonic() + SETTLE_MS / 1000
    text, since = assistant_text(page), time.monotonic()
    while time.monotonic() - since < quiet_s:
        if time.monotonic() > deadline:
            pytest.fail("the stopped answer kept changing")
        page.wait_for_timeout(100)
        if (now := assistant_text(page)) != text:
            text, since = now, time.monotonic()
    return text


def test_switch_models_and_see_the_status_change(page, ui_server) -> None:
    choose_model(page, "alpha")
    send(page, "Say hi.")
    page.locator(ASSISTANT).first.wait_for(timeout=ANSWER_TIMEOUT_MS)
    page.get_by_role("button", name="Stop generation").wait_for(state="hidden", timeout=ANSWER_TIMEOUT_MS)
    wait_for_ui_statuses(page, {"alpha": "loaded", "beta": "unloaded"})
    choose_model(page, "beta")
    send(page, "Say hello.")
    page.locator(ASSISTANT).nth(1).wait_for(timeout=ANSWER_TIMEOUT_MS)  # the second answer, from beta
    page.get_by_role("button", name="Stop generation").wait_for(state="hidden", timeout=ANSWER_TIMEOUT_MS)
    # the swap, as the UI learnt it from /models/sse: alpha unloaded, beta loaded
    wait_for_ui_statuses(page, {"alpha": "unloaded", "beta": "loaded"})
    # the UI shows the switch: the second answer carries beta's model badge, the first keeps alpha's
    assert page.locator(ASSISTANT).nth(1).get_by_text("beta", exact=True).count() == 1
    assert page.locator(ASSISTANT).nth(0).get_by_text("alpha", exact=True).count() == 1


def test_reload_mid_stream_and_see_the_stream_resume(page, ui_server) -> None:
    choose_model(page, "alpha")
    send(page, "Write a very long story about a lighthouse keeper and the sea, with many chapters.")
    page.wait_for_function(f"([...document.querySelectorAll('{ANSWER}')].pop()?.innerText || '').length > 40",
                           timeout=ANSWER_TIMEOUT_MS)
    before = assistant_text(page)
    page.reload()
    page.wait_for_function(
        f"([...document.querySelectorAll('{ANSWER}')].pop()?.innerText || '').length > {len(before) + 40}",
        timeout=ANSWER_TIMEOUT_MS)
    after = assistant_text(page)
    assert after.startswith(before[: max(0, len(before) - 20)])  # the same answer, continued
    streams = httpx.get(ui_server.url + "/v1/streams").json()
    assert streams and streams[-1]["total_bytes"] > 0


def test_a_long_prompt_shows_its_progress(page, ui_server) -> None:
    """llama-ui asks for `return_progress` and shows each `prompt_progress` chunk as "Processing N% (ETA: ...)"
    until the answer starts: a prompt of several prefill chunks (alpha's are 64 tokens) shows a percentage below 100
    while its later chunks are read (without the chunks the UI says only "Processing...")."""
    choose_model(page, "alpha")
    send(page, "Summarize this text in one sentence. " + "The quick brown fox jumps over the lazy dog. " * 25)
    page.get_by_text(re.compile(r"Processing \d{1,2}% ")).wait_for(timeout=ANSWER_TIMEOUT_MS)
    stop = page.get_by_role("button", name="Stop generation")  # the answer itself is not what this test is about
    stop.click()
    stop.wait_for(state="hidden", timeout=SETTLE_MS)


def test_dashboard_shows_live_slot_state(browser, ui_server) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    page.goto(ui_server.url + "/dashboard")
    client = httpx.Client(base_url=ui_server.url, timeout=120)
    body = {"model": "alpha", "max_tokens": 300, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}]}
    with client.stream("POST", "/v1/chat/completions", json=body) as stream:
        lines = stream.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        page.locator("#slots td.state-busy").first.wait_for(timeout=SETTLE_MS)
        page.wait_for_function("Number(document.getElementById('tps').textContent) > 0", timeout=SETTLE_MS)
        page.screenshot(path=str(SCREENSHOTS / "webui-dashboard.png"))
        row = page.locator('#models tr[data-model="alpha"]').inner_text()
        assert "loaded" in row
    # Leaving the stream cancels the generation (no need to wait for its 300 tokens): the slot shows free again.
    page.locator("#slots td.state-busy").first.wait_for(state="detached", timeout=SETTLE_MS)
    # The prefix cache card: the server's counters of finished generations' prompt tokens (a one-token answer makes
    # sure there is one; the cancelled one may not count) and those read from the cache, and that the prefix cache
    # is on; a cached token the server counts shows up on the next poll.
    assert client.post("/v1/chat/completions", json={**body, "stream": False, "max_tokens": 1}).status_code == 200
    counted = client.get("/dashboard/state").json()["prefix_cache"]
    prompt_tokens, cached = counted["prompt_tokens"], counted["cached_prompt_tokens"]
    card = page.locator("#prefix-cache")
    wait_until(lambda: card.inner_text().startswith(f"{cached} / {prompt_tokens} tok"),
               lambda: f"the prefix cache card shows {card.inner_text()!r}, the server counted {cached} / {prompt_tokens}")
    assert page.locator("#prefix-cache-note").inner_text() == "prompt tokens from the cache"
    ui_server.router.metrics.cached_tokens.inc(3)  # as ServedModel.record_generation would add usage.cached_tokens
    wait_until(lambda: card.inner_text().startswith(f"{cached + 3} / "),
               lambda: f"the card still shows {card.inner_text()!r}")
    context.close()


def test_skip_reasoning_ends_it_and_the_answer_follows(browser, thinking_server) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    # Long enough that the reasoning is still running when the button is pressed, however fast the machine.
    context.add_init_script(f"localStorage.setItem('LlamaUi.config', {json.dumps(json.dumps({'max_tokens': 900}))})")
    page = context.new_page()
    page.goto(thinking_server.url + "/")
    send(page, "Hello")
    skip = page.get_by_role("button", name="Skip reasoning")
    skip.wait_for(timeout=ANSWER_TIMEOUT_MS)
    with page.expect_response("**/v1/chat/completions/control") as control:
        skip.click()
    assert control.value.json()["success"] is True
    skip.wait_for(state="hidden", timeout=SETTLE_MS)  # the UI saw the answer start
    # The server's recording of the stream (llama-ui sends X-Conversation-Id): reasoning deltas, then the answer's.
    client = httpx.Client(base_url=thinking_server.url, timeout=60)
    (stream,) = client.get("/v1/streams").json()
    kinds: list[str] = []
    with client.stream("GET", "/v1/stream", params={"conv_id": stream["conversation_id"]}) as replay:
        for line in replay.iter_lines():
            if line.startswith("data: {") and '"choices":[{' in line:
                delta = json.loads(line[6:])["choices"][0]["delta"]
                kinds += [k for k in ("reasoning_content", "content") if delta.get(k)]
            if kinds.count("content") >= 3:
                break
    assert kinds[0] == "reasoning_content" and "content" in kinds
    first_answer = kinds.index("content")
    assert all(k == "content" for k in kinds[first_answer:]), "reasoning after the answer started"
    try:  # on a loaded machine the noise answer can reach max_tokens first: then there is nothing to stop
        page.get_by_role("button", name="Stop generation").click(timeout=5_000)
    except PlaywrightTimeoutError:
        pass
    wait_until(lambda: not any(s["is_processing"] for s in client.get("/slots").json()),
               lambda: "the generation still holds its lane")
    context.close()


def png_bytes(width: int, height: int) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng().integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def attach(page, name: str, data: bytes, mime: str) -> None:
    """As the attachment button's file chooser hands llama-ui a file (its hidden file input's change event)."""
    page.locator('input[type="file"]').first.set_input_files(files=[{"name": name, "mimeType": mime, "buffer": data}])


def test_attach_an_image_and_see_an_answer(browser, vision_ui_server) -> None:
    server = vision_ui_server
    context = chat_context(browser, {"max_tokens": 24, "temperature": 0})
    page = context.new_page()
    bodies: list[dict] = []
    page.on("request", lambda r: bodies.append(r.post_data_json) if r.url.endswith("/v1/chat/completions") else None)
    page.goto(server.url + "/")
    choose_model(page, "seer", ("seer", "plain"))
    image = png_bytes(96, 96)
    attach(page, "noise.png", image, "image/png")
    prompt_before, _ = server.router.metrics.prompt_token_totals()
    generated_before = server.router.metrics.generated_token_total()
    send(page, "What is in this picture?")
    page.wait_for_function(f"(document.querySelector('{ASSISTANT}')?.innerText || '').trim().length > 0",
                           timeout=ANSWER_TIMEOUT_MS)
    page.get_by_role("button", name="Stop generation").wait_for(state="hidden", timeout=ANSWER_TIMEOUT_MS)
    assert page.get_by_text("File Upload Error").count() == 0
    # llama-ui sent the picture as an OpenAI image_url data URL part, and the server answered with it in the prompt:
    # the generation's prompt counted the image's vision tokens (96 x 96 pixels: 144 here) besides the text's.
    (body,) = bodies
    parts = body["messages"][-1]["content"]
    urls = [p["image_url"]["url"] for p in parts if isinstance(p, dict) and p.get("type") == "image_url"]
    assert len(urls) == 1 and urls[0].startswith("data:image/png;base64,"), parts
    (entry,) = [e for e in server.router.entries if e.name == "seer"]
    vision_tokens = entry.served.engine.frontend.vision.image(image, part="x").num_tokens
    wait_until(lambda: server.router.metrics.prompt_token_totals()[0] - prompt_before > vision_tokens + 2,
               lambda: f"the generation's prompt counted {server.router.metrics.prompt_token_totals()[0] - prompt_before}"
                       f" tokens, not the image's {vision_tokens} and its markers plus the text")
    # The answer is the model's (the tiny random model reasons until max_tokens: llama-ui shows its reasoning).
    assert server.router.metrics.generated_token_total() - generated_before == 24
    page.screenshot(path=str(SCREENSHOTS / "webui-image.png"))
    context.close()


def test_a_text_only_model_refuses_the_image_clearly(browser, vision_ui_server) -> None:
    context = chat_context(browser)
    page = context.new_page()
    page.goto(vision_ui_server.url + "/")
    choose_model(page, "plain", ("seer", "plain"))
    attach(page, "noise.png", png_bytes(32, 32), "image/png")
    dialog = page.get_by_role("alertdialog")
    dialog.wait_for(timeout=SETTLE_MS)
    text = dialog.inner_text()
    assert "File Upload Error" in text and "noise.png" in text and "Images require a vision-capable model" in text
    context.close()
