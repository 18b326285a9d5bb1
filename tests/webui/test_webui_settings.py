"""llama-ui's settings against a live router, in headless Chromium (issue 19, items 1, 3 and 6): the settings dialog
shows the defaults a request that sets nothing gets (`/props` of the chosen model: the recommended values under the
router config's per-model `sampling` and `max_tokens`), a page load probes `/tools` without a 404 or a console error,
and the sampler settings the dialog saves (the stage order, XTC) reach the sampler. Screenshot: docs/."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from live_servers import artifact_for, serve_router
from test_llama_ui import (
    ANSWER,
    ANSWER_TIMEOUT_MS,
    PAGE_TIMEOUT_MS,
    SCREENSHOTS,
    assistant_text,
    chat_context,
    choose_model,
    send,
)

# Overrides in the router config, so that the dialog's values can only have come from this server's /props.
OVERRIDES = {"temperature": 0.35, "top_k": 17}
DEFAULT_MAX_TOKENS = 321
PROMPT = "What is the capital of France? Answer in one sentence."


@pytest.fixture(scope="module")
def settings_server(pytestconfig, smollm2_gguf, llama_ui_bundle) -> Iterator:
    smollm2 = str(artifact_for(pytestconfig, smollm2_gguf))
    config = {"models": {"alpha": {"path": smollm2, "max_context": 1024, "sampling": OVERRIDES,
                                   "max_tokens": DEFAULT_MAX_TOKENS},
                         "beta": {"path": smollm2, "max_context": 1024}}}
    with serve_router(config, webui_dir=str(llama_ui_bundle)) as server:
        yield server


def shown_default(params: dict, key: str) -> str:
    """The placeholder llama-ui gives a field with a server default (normalizeFloatingPoint: six decimals)."""
    value = params[key]
    return f"Default: {round(value, 6) if isinstance(value, float) else value:g}"


def test_the_settings_show_the_defaults_a_request_gets(browser, settings_server) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 860})  # a first visit: no saved settings
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    failed, probes, console_errors = [], [], []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.on("response", lambda r: probes.append((r.request.method, r.status)) if r.url.endswith("/tools") else None)
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.goto(settings_server.url + "/")
    page.locator("textarea").first.wait_for()
    choose_model(page, "alpha")
    page.get_by_role("button", name="Settings").first.click()
    page.get_by_text("Sampling & Penalties").first.click()
    params = httpx.get(settings_server.url + "/props", params={"model": "alpha"}, timeout=60).json()[
        "default_generation_settings"]["params"]
    assert {k: params[k] for k in OVERRIDES} == OVERRIDES and params["max_tokens"] == DEFAULT_MAX_TOKENS
    for key in ("temperature", "top_k", "top_p", "min_p", "max_tokens", "dry_base", "xtc_threshold"):
        field = page.locator(f"input#{key}")
        field.wait_for()
        # empty (the request sends nothing, so the server's default applies), the default shown beside it
        assert (field.input_value(), field.get_attribute("placeholder")) == ("", shown_default(params, key)), key
    page.locator("input#temperature").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "webui-settings.png"))
    # llama-ui probed the server's tools (GET /tools, the list; POST /tools, a file tool by name) and got answers,
    # not 404s; nothing the page asked for failed
    assert {method for method, _ in probes} == {"GET", "POST"} and {status for _, status in probes} == {200}, probes
    assert failed == [] and console_errors == [], (failed, console_errors)
    context.close()


def test_sampler_settings_reach_the_sampler(browser, settings_server) -> None:
    # The stage order top-k then XTC, top-k 2 and XTC always on at threshold 0: of the two likeliest tokens, XTC
    # removes all but the least likely, so the one token answered is the second likeliest, whatever the seed.
    settings = {"max_tokens": 1, "samplers": "top_k;xtc", "top_k": 2, "xtc_probability": 1, "xtc_threshold": 0}
    context = chat_context(browser, settings)
    page = context.new_page()
    bodies: list[dict] = []
    page.on("request", lambda r: bodies.append(r.post_data_json) if r.url.endswith("/v1/chat/completions") else None)
    page.goto(settings_server.url + "/")
    choose_model(page, "alpha")
    send(page, PROMPT)
    page.locator(ANSWER).last.wait_for(timeout=ANSWER_TIMEOUT_MS)
    page.get_by_role("button", name="Stop generation").wait_for(state="hidden", timeout=ANSWER_TIMEOUT_MS)
    (body,) = bodies
    assert body["samplers"] == ["top_k", "xtc"] and body["xtc_probability"] == 1 and body["top_k"] == 2
    # The same request, greedy with the two likeliest first tokens' logprobs: the reference.
    reference = {k: v for k, v in body.items() if k not in ("samplers", "xtc_probability", "xtc_threshold")}
    greedy = httpx.post(settings_server.url + "/v1/chat/completions", timeout=120, json={
        **reference, "stream": False, "temperature": 0, "logprobs": True, "top_logprobs": 2}).json()
    first, second = (t["token"] for t in greedy["choices"][0]["logprobs"]["content"][0]["top_logprobs"])
    assert second.strip().isalpha() and first.strip() != second.strip(), (first, second)  # shown as it is
    assert assistant_text(page).strip() == second.strip()
    context.close()
