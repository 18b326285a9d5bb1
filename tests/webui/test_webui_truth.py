"""The real llama-ui and ninfer's dashboard in headless Chromium, on what a person meets first (issue 19): a live
generation speed while the answer streams, two tabs on one conversation, a swap's wait shown, and a dashboard that
tells the truth (busy is not idle, KV in use vs reserved, a load's progress, a disconnected state that greys old
figures, a 360 px layout). Screenshots go to docs/."""

from __future__ import annotations

import math
import re
import threading

import httpx
from live_servers import artifact_for, serve_router
from ninfer.engine import Engine
from test_llama_ui import (
    ANSWER,
    ANSWER_TIMEOUT_MS,
    ASSISTANT,
    PAGE_TIMEOUT_MS,
    SCREENSHOTS,
    SETTLE_MS,
    chat_context,
    choose_model,
    send,
    wait_for_statuses,
    wait_for_ui_statuses,
    wait_until,
)

LONG_PROMPT = "Write a very long story about a lighthouse keeper and the sea, with many chapters."
LONG_BODY = {"model": "alpha", "max_tokens": 1500, "temperature": 0, "stream": True,
             "messages": [{"role": "user", "content": LONG_PROMPT}]}


def busy_slots(server, model: str = "alpha") -> list[dict]:
    return [s for s in httpx.get(server.url + "/slots", params={"model": model}, timeout=30).json()
            if s["is_processing"]]


class HeldStream:
    """A long streamed generation on `model`, held open from another thread until `release`."""

    def __init__(self, server, model: str = "alpha") -> None:
        self._release = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server, model), daemon=True)
        self._thread.start()
        assert self._started.wait(ANSWER_TIMEOUT_MS / 1000), "the held generation never started"

    def _run(self, server, model: str) -> None:
        body = {**LONG_BODY, "model": model}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=300) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= 4:
                    self._started.set()
                if self._release.is_set():
                    return  # leaving cancels it

    def release(self) -> None:
        self._release.set()
        self._thread.join(60)


def chat_page(browser, server):
    context = chat_context(browser)
    page = context.new_page()
    page.goto(server.url + "/")
    return context, page


def test_the_generation_speed_is_live_while_the_answer_streams(browser, ui_server) -> None:
    context, page = chat_page(browser, ui_server)
    choose_model(page, "alpha")
    send(page, LONG_PROMPT)
    page.wait_for_function(f"([...document.querySelectorAll('{ANSWER}')].pop()?.innerText || '').length > 20",
                           timeout=ANSWER_TIMEOUT_MS)
    # llama-ui's message statistics ("N tokens", "T s", "R t/s"), from the chunks' timings (timings_per_token):
    # they grow while the answer streams, not only once it has ended
    def statistics() -> tuple[int, float]:
        text = page.locator(ASSISTANT).last.inner_text()
        found = re.search(r"\n(\d+) tokens\n[\d.]+s\n([\d.]+) t/s", text)
        assert found, f"no live statistics under the answer: {text[-200:]!r}"
        return int(found.group(1)), float(found.group(2))

    page.wait_for_function(f"/\\d+ tokens/.test([...document.querySelectorAll('{ASSISTANT}')].pop()?.innerText)",
                           timeout=SETTLE_MS)
    first_count, first_rate = statistics()
    page.wait_for_timeout(1500)
    later_count, later_rate = statistics()
    assert page.get_by_role("button", name="Stop generation").is_visible(), "the answer ended before the check"
    assert later_count > first_count and first_rate > 0 and later_rate > 0
    assert page.get_by_text(re.compile(r"Processing 100%")).count() == 0  # no stale prompt progress
    page.get_by_role("button", name="Stop generation").click()
    context.close()


def test_two_tabs_on_one_conversation(browser, ui_server) -> None:
    context = chat_context(browser, {"max_tokens": 400, "temperature": 0}, width=1000)
    tab_a = context.new_page()
    tab_a.goto(ui_server.url + "/")
    choose_model(tab_a, "alpha")
    send(tab_a, "Say hi.")
    tab_a.locator(ANSWER).first.wait_for(timeout=ANSWER_TIMEOUT_MS)
    tab_a.get_by_role("button", name="Stop generation").wait_for(state="hidden", timeout=ANSWER_TIMEOUT_MS)
    tab_b = context.new_page()
    tab_b.goto(tab_a.url)  # the same conversation, open in a second tab while it is idle
    tab_b.locator(ANSWER).first.wait_for(timeout=ANSWER_TIMEOUT_MS)
    send(tab_a, LONG_PROMPT)
    tab_a.wait_for_function(f"document.querySelectorAll('{ANSWER}').length == 2 && "
                            f"[...document.querySelectorAll('{ANSWER}')].pop().innerText.length > 20",
                            timeout=ANSWER_TIMEOUT_MS)
    (a_slot,) = busy_slots(ui_server)
    # Tab B, which does not know of A's answer, asks something else on the same conversation while A's answer still
    # runs: A's generation is cancelled (one generation per conversation), B's runs, and it is the one recorded.
    send(tab_b, "Now write a long poem about the sea.")
    tab_a.get_by_role("button", name="Stop generation").wait_for(state="hidden", timeout=SETTLE_MS)
    wait_until(lambda: [s["request_id"] for s in busy_slots(ui_server)] not in ([], [a_slot["request_id"]]),
               lambda: f"busy slots: {busy_slots(ui_server)}, A's was {a_slot}")
    assert len(busy_slots(ui_server)) == 1
    (recorded,) = [s for s in httpx.get(ui_server.url + "/v1/streams").json() if not s["is_done"]]
    assert recorded["conversation_id"] == a_slot["conversation_id"]
    tab_b.screenshot(path=str(SCREENSHOTS / "webui-two-tabs.png"))
    # B's Stop ends exactly B's generation (its recording is the conversation's) and nothing runs on unrecorded.
    tab_b.get_by_role("button", name="Stop generation").click()
    wait_until(lambda: not busy_slots(ui_server), lambda: f"still busy: {busy_slots(ui_server)}")
    # llama-ui's Stop forgets the recording (DELETE /v1/stream): none is left running
    running = [s for s in httpx.get(ui_server.url + "/v1/streams").json() if not s["is_done"]]
    assert running == [], running
    context.close()


def test_a_swap_that_waits_shows_why(browser, ui_server) -> None:
    context, page = chat_page(browser, ui_server)
    httpx.post(ui_server.url + "/models/load", json={"model": "alpha"}, timeout=30)
    wait_for_statuses(ui_server, {"alpha": "loaded", "beta": "unloaded"}, timeout_s=ANSWER_TIMEOUT_MS / 1000)
    held = HeldStream(ui_server)
    waiting = "waiting for 1 request on alpha"
    try:
        # The person asks beta while alpha's answer runs: llama-ui shows beta's spinner (the wait is reported as a
        # load at 0%), not a plain "unloaded", and says what it waits for (waiting-message.patch) under the question
        # and as the title of beta's row in the model selector.
        choose_model(page, "beta")
        send(page, "Hi")
        wait_for_ui_statuses(page, {"alpha": "loaded", "beta": "loading"})
        page.locator(ASSISTANT).get_by_text(waiting, exact=True).wait_for(timeout=SETTLE_MS)
        assert beta_option_title(page) == waiting
        page.mouse.move(640, 400)  # off the selector: no tooltip over the screenshot
        page.screenshot(path=str(SCREENSHOTS / "webui-waiting.png"))
        dashboard = browser.new_page(viewport={"width": 1280, "height": 900})
        dashboard.goto(ui_server.url + "/dashboard")
        row = dashboard.locator('#models tr[data-model="beta"]')
        row.get_by_text(waiting).wait_for(timeout=SETTLE_MS)
        assert "busy" in dashboard.locator('#models tr[data-model="alpha"]').inner_text()
        dashboard.screenshot(path=str(SCREENSHOTS / "webui-dashboard-waiting.png"))
        dashboard.close()
    finally:
        held.release()
    wait_for_statuses(ui_server, {"alpha": "unloaded", "beta": "loaded"}, timeout_s=ANSWER_TIMEOUT_MS / 1000)
    page.locator(ANSWER).first.wait_for(timeout=ANSWER_TIMEOUT_MS)  # beta answers once loaded
    page.get_by_role("button", name="Stop generation").wait_for(state="hidden", timeout=ANSWER_TIMEOUT_MS)
    assert page.get_by_text(waiting).count() == 0  # the reason went with the wait
    context.close()


def beta_option_title(page) -> str | None:
    """The title llama-ui gives beta's row in its model selector (opened, then closed again)."""
    page.locator("button:has-text('beta')").last.click()
    option = page.get_by_role("option").filter(has_text="beta")
    title = option.get_attribute("title")
    page.keyboard.press("Escape")
    option.wait_for(state="hidden")
    return title


def test_the_dashboard_at_360_px_and_disconnected(browser, ui_server) -> None:
    page = browser.new_page(viewport={"width": 360, "height": 760})
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    page.goto(ui_server.url + "/dashboard")
    held = HeldStream(ui_server)
    try:
        page.locator("#slots td.state-busy").first.wait_for(timeout=SETTLE_MS)
        page.wait_for_function("Number(document.getElementById('tps').textContent) > 0", timeout=SETTLE_MS)
        # KV: the tokens the running slot holds, of the pages reserved for it (whole 64-token pages)
        kv = page.locator("#kv").inner_text()
        in_use, reserved = (int(n) for n in re.fullmatch(r"(\d+) / (\d+) tok", kv).groups())
        assert 0 < in_use <= reserved and reserved % 64 == 0, kv
        assert page.locator('#models tr[data-model="alpha"] td').nth(3).inner_text().startswith("busy")
        # nothing wider than the screen: the tables scroll inside their own boxes
        assert page.evaluate("document.documentElement.scrollWidth") <= 360
        page.screenshot(path=str(SCREENSHOTS / "webui-dashboard-narrow.png"), full_page=True)
    finally:
        held.release()
    # After the generation: its tokens count in the totals, and the rate falls over its window (not at once to 0).
    page.locator("#slots td.state-busy").first.wait_for(state="detached", timeout=SETTLE_MS)
    page.wait_for_function("/^[1-9]\\d* generated/.test(document.getElementById('totals').textContent)",
                           timeout=SETTLE_MS)
    # The server goes away (every poll fails): the page says since when, and greys what it shows.
    page.route("**/dashboard/state", lambda route: route.abort())
    page.get_by_text(re.compile(r"^disconnected since ")).wait_for(timeout=SETTLE_MS)
    assert page.evaluate("document.body.classList.contains('stale')")
    assert page.evaluate("getComputedStyle(document.querySelector('main')).filter") == "grayscale(1)"
    page.screenshot(path=str(SCREENSHOTS / "webui-dashboard-disconnected.png"), full_page=True)
    page.unroute("**/dashboard/state")
    page.get_by_text("live", exact=True).wait_for(timeout=SETTLE_MS)
    assert not page.evaluate("document.body.classList.contains('stale')")
    page.close()


class PausedLoad:
    """Engine.open whose real load stops at the first fraction it reports below 1 (its loading thread waits in the
    progress callback) until `gate` is set: the load's progress as it really was, held still for the dashboard."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.paused = threading.Event()
        self.fraction = 0.0

    async def __call__(self, path, options, progress, host_tier):
        def report(fraction: float) -> None:
            progress(fraction)
            if not self.paused.is_set() and 0 < fraction < 1:
                self.fraction = fraction
                self.paused.set()
                self.gate.wait(ANSWER_TIMEOUT_MS / 1000)  # bounded: a failing test must not hang the load

        return await Engine.open(path, options, report, host_tier)


def test_the_dashboard_shows_a_load_in_progress(browser, pytestconfig, smollm2_gguf) -> None:
    paused = PausedLoad()
    config = {"models": {"alpha": {"path": str(artifact_for(pytestconfig, smollm2_gguf)), "max_context": 1024}}}
    with serve_router(config, open_engine=paused) as server:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        page.goto(server.url + "/dashboard")
        row = page.locator('#models tr[data-model="alpha"]')
        row.get_by_text("unloaded").wait_for(timeout=SETTLE_MS)
        loading = threading.Thread(target=httpx.post, args=(server.url + "/models/load",),
                                   kwargs={"json": {"model": "alpha"}, "timeout": 300}, daemon=True)
        loading.start()
        try:
            assert paused.paused.wait(ANSWER_TIMEOUT_MS / 1000), "the load reported no progress"
            percent = math.floor(100 * paused.fraction + 0.5)  # as the page's Math.round
            row.get_by_text(f"loading {percent}%", exact=True).wait_for(timeout=SETTLE_MS)
        finally:
            paused.gate.set()
        row.get_by_text("loaded", exact=True).wait_for(timeout=ANSWER_TIMEOUT_MS)
        loading.join(ANSWER_TIMEOUT_MS / 1000)
        page.close()
