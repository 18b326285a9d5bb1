"""Where the pinned llama-ui bundle lives: `make webui` (webui/build_llama_ui.py) installs it, `ninfer-serve --webui`
serves it. One folder per pin, so a new pin never serves a stale bundle:

    $NINFER_WEBUI_DIR, else ${XDG_CACHE_HOME:-~/.cache}/ninfer/webui/llama-ui-<version>-<sha256[:12]>
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ninfer.errors import NinferError


def _read_pin() -> dict[str, Any]:
    # webui/pin.json in a checkout (editable install); the copy inside the package otherwise.
    for candidate in (Path(__file__).resolve().parents[3] / "webui" / "pin.json",
                      Path(__file__).with_name("webui_pin.json")):
        if candidate.is_file():
            return json.loads(candidate.read_text(encoding="utf-8"))
    return {"version": "unknown", "sha256": "unknown"}


PIN = _read_pin()

DASHBOARD_DIR = Path(__file__).resolve().parents[3] / "webui" / "dashboard"


def bundle_dir() -> Path:
    override = os.environ.get("NINFER_WEBUI_DIR")
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "ninfer" / "webui" / f"llama-ui-{PIN['version']}-{PIN['sha256'][:12]}"


def installed_bundle() -> Path:
    """The built bundle, or a NinferError that says how to build it."""
    folder = bundle_dir()
    if not (folder / "index.html").is_file():
        raise NinferError(f"--webui: the built-in web UI is not bundled yet: no llama-ui bundle at {folder}; "
                          "run `make webui` (or give --webui-dir DIR)")
    return folder
