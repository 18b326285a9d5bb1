"""Browser fixtures: Debian's chromium driven by Playwright through its executable path (no browser download), and a
live router server serving the pinned llama-ui bundle (built by `make webui`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from live_servers import artifact_for, serve_router

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def llama_ui_bundle() -> Path:
    from ninfer.errors import NinferError
    from ninfer.serve.webui_bundle import installed_bundle

    try:
        return installed_bundle()
    except NinferError as exc:
        pytest.skip(f"{exc}")


# Module scope: Playwright's sync API keeps an event loop running in the main thread while it is open, and any
# later test calling asyncio.run() would fail (whatever order the tests run in).
@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (make system-deps installs it)")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def ui_server(pytestconfig, smollm2_gguf, llama_ui_bundle) -> Iterator:
    smollm2 = artifact_for(pytestconfig, smollm2_gguf)
    # alpha prefills in chunks of 64 tokens, so that a prompt of a few hundred tokens shows its progress in several
    # steps (the other tests' prompts are a single chunk either way).
    config = {"models": {"alpha": {"path": str(smollm2), "max_context": 2048, "prefill_chunk": 64},
                         "beta": {"path": str(smollm2), "max_context": 1024, "max_concurrency": 1}}}
    with serve_router(config, webui_dir=str(llama_ui_bundle)) as server:
        yield server


@pytest.fixture(scope="module")
def thinking_server(pytestconfig, tiny_qwen3_5, llama_ui_bundle):
    """The tiny random Qwen3.5 model: it reasons by default and, writing noise, never ends its reasoning itself."""
    config = {"models": {"thinker": {"path": str(artifact_for(pytestconfig, tiny_qwen3_5)), "max_context": 1024}}}
    with serve_router(config, webui_dir=str(llama_ui_bundle)) as server:
        yield server


@pytest.fixture(scope="module")
def vision_ui_server(pytestconfig, tiny_qwen3_5, llama_ui_bundle):
    """The tiny random Qwen3.5 model twice: `seer` with its vision tower loaded, `plain` without (text only)."""
    path = str(artifact_for(pytestconfig, tiny_qwen3_5))
    config = {"models": {"seer": {"path": path, "max_context": 1024, "vision": True},
                         "plain": {"path": path, "max_context": 1024}}}
    with serve_router(config, webui_dir=str(llama_ui_bundle)) as server:
        yield server
