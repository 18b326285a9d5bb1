"""A failed request, as a person sees it in llama-ui (issue 19, item 6): no empty reply bubble is left behind, and the
server's own message is shown. The pinned UI creates the reply's bubble before it sends and ignores an `error`
chunk in a stream; ninfer's patch (python/ninfer/serve/webui/patches/error-replies.patch, applied by `make webui`)
removes a reply that failed before it had anything and ends a stream at its error chunk.

The real server refuses each request in its own way:
- 400: a sampling value out of range (the UI's settings send `temperature: 5`);
- 503: the server shutting down (its graceful shutdown, ninfer.serve.shutdown, started on its own event loop), and
  a stream that was running then ends with the protocol's error chunk: the dialog shows why, the partial answer
  stays;
- 429: the engine full (its one lane busy with another client's answer, no queue): the same path in llama-ui as a
  400 or a 503 before the stream (a response that is not ok: its JSON error's message goes to the dialog), so the
  same patch leaves no bubble and shows the server's "the engine is busy ... retry later".
On the unpatched UI the 400 and the 429 tests fail: the empty reply bubble stays (checked with the pin built
without the patch).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from live_servers import artifact_for, serve_router
from test_llama_ui import (
    ANSWER,
    ANSWER_TIMEOUT_MS,
    ASSISTANT,
    SETTLE_MS,
    UI_SETTINGS,
    assistant_text,
    chat_context,
    send,
)
from test_webui_truth import HeldStream

USER = '[aria-label="User message with actions"]'
DIALOG = "[role=alertdialog]"
LONG_ANSWER = "Write a very long story about a lighthouse keeper and the sea, with many chapters."


@pytest.fixture
def one_lane_server(pytestconfig, smollm2_gguf, llama_ui_bundle) -> Iterator:
    """One model, one lane, no queue."""
    smollm2 = artifact_for(pytestconfig, smollm2_gguf)
    config = {"models": {"solo": {"path": str(smollm2), "max_context": 2048, "max_concurrency": 1,
                                  "max_queue": 0}}}
    with serve_router(config, webui_dir=str(llama_ui_bundle)) as server:
        yield server


def open_chat(browser, server, settings: dict = UI_SETTINGS):
    context = chat_context(browser, settings)
    page = context.new_page()
    page.goto(server.url + "/")
    page.locator("textarea").first.wait_for()
    return context, page


def refused_reply(page, text: str) -> tuple[int, str]:
    """Sends `text`; returns the chat request's status and the error dialog's text, once the failed reply settled."""
    with page.expect_response(lambda r: r.url.endswith("/v1/chat/completions")) as answered:
        send(page, text)
    page.locator(DIALOG).wait_for(timeout=SETTLE_MS)
    page.locator(USER).last.wait_for()
    page.wait_for_function(f"document.querySelectorAll('{ASSISTANT}').length === 0", timeout=SETTLE_MS)
    return answered.value.status, page.locator(DIALOG).inner_text()


def close_dialog(page) -> None:
    page.keyboard.press("Escape")
    page.locator(DIALOG).wait_for(state="hidden")


def test_a_refused_value_leaves_no_empty_reply_and_says_why(browser, one_lane_server) -> None:
    context, page = open_chat(browser, one_lane_server, {**UI_SETTINGS, "temperature": 5})
    try:
        status, shown = refused_reply(page, "Hello there")
        assert status == 400
        assert "Server Error" in shown and "temperature" in shown, shown
        assert page.locator(USER).last.inner_text().strip().startswith("Hello there")
    finally:
        context.close()


def test_a_shutdown_ends_the_stream_with_its_reason_and_refuses_the_next(browser, one_lane_server) -> None:
    context, page = open_chat(browser, one_lane_server, {**UI_SETTINGS, "max_tokens": 1500})
    try:
        send(page, LONG_ANSWER)
        page.wait_for_function(f"([...document.querySelectorAll('{ANSWER}')].pop()?.innerText || '').length > 20",
                               timeout=ANSWER_TIMEOUT_MS)
        # What SIGTERM runs (ninfer-serve's handler), with no grace: the running stream ends with its error chunk.
        drain = one_lane_server.app.state.drain
        asyncio.run_coroutine_threadsafe(drain.run(0.0), one_lane_server.loop)
        page.locator(DIALOG).wait_for(timeout=SETTLE_MS)
        shown = page.locator(DIALOG).inner_text()
        assert "the server shut down before this answer was complete" in shown, shown
        page.get_by_role("button", name="Stop generation").wait_for(state="hidden", timeout=SETTLE_MS)
        partial = assistant_text(page)
        assert len(partial) > 20  # the partial answer stays, in its bubble
        close_dialog(page)
        # A new request while the server drains is refused: its reply leaves no bubble (the first one stays).
        with page.expect_response(lambda r: r.url.endswith("/v1/chat/completions")) as answered:
            send(page, "Hello again")
        page.locator(DIALOG).wait_for(timeout=SETTLE_MS)
        assert answered.value.status == 503 and "shutting down" in page.locator(DIALOG).inner_text()
        page.wait_for_function(f"document.querySelectorAll('{ASSISTANT}').length === 1", timeout=SETTLE_MS)
        assert assistant_text(page) == partial
    finally:
        context.close()


def test_a_full_server_refuses_and_says_so(browser, one_lane_server) -> None:
    context, page = open_chat(browser, one_lane_server)
    held = HeldStream(one_lane_server, model="solo")  # the one lane busy, no queue: the next request is a 429
    try:
        status, shown = refused_reply(page, "Hello there")
        assert status == 429
        assert "Server Error" in shown and "the engine is busy" in shown and "retry later" in shown, shown
        assert page.locator(USER).last.inner_text().strip().startswith("Hello there")
    finally:
        held.release()
        context.close()
