"""The web UI's files. They live inside the package (python/ninfer/serve/webui/, shipped in the wheel and the Nix
package with the Python code): ninfer's own `/dashboard` page, `pin.json`, the pinned llama-ui release, and
`patches/*.patch`, the changes ninfer makes to that release's source before building it (applied in name order).

The llama-ui bundle itself is built, not shipped: `make webui` (webui/build_llama_ui.py) builds the pin, patched,
into one folder per pin and patch set, so a new pin or patch never serves a stale bundle, and `ninfer-serve --webui`
serves it from there:

    $NINFER_WEBUI_DIR, else ${XDG_CACHE_HOME:-~/.cache}/ninfer/webui/llama-ui-<version>-<sha256[:12]>-<patches[:12]>

(`<patches>`: the sha256 of the patch files' names and contents, `patches_digest`.)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ninfer.errors import NinferError

PACKAGE_WEBUI_DIR = Path(__file__).resolve().with_name("webui")
DASHBOARD_DIR = PACKAGE_WEBUI_DIR / "dashboard"
PIN = json.loads((PACKAGE_WEBUI_DIR / "pin.json").read_text(encoding="utf-8"))
PATCHES_DIR = PACKAGE_WEBUI_DIR / "patches"


def ui_patches() -> list[Path]:
    """The patches to the pinned UI source, in the order they apply (`patch -p1` in the UI folder)."""
    return sorted(PATCHES_DIR.glob("*.patch"))


def patches_digest(patches: list[Path] | None = None) -> str:
    """sha256 over each patch's name and bytes: a bundle built with other patches lives in another folder."""
    digest = hashlib.sha256()
    for patch in ui_patches() if patches is None else patches:
        digest.update(patch.name.encode() + b"\0" + patch.read_bytes() + b"\0")
    return digest.hexdigest()


def bundle_dir() -> Path:
    override = os.environ.get("NINFER_WEBUI_DIR")
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "ninfer" / "webui" / f"llama-ui-{PIN['version']}-{PIN['sha256'][:12]}-{patches_digest()[:12]}"


def installed_bundle() -> Path:
    """The built bundle, or a NinferError that says how to build it."""
    folder = bundle_dir()
    if not (folder / "index.html").is_file():
        raise NinferError(f"--webui: the llama-ui {PIN['version']} bundle is not built: no index.html in {folder}; "
                          "build it with `make webui` in a ninfer checkout, or give --webui-dir DIR (a built "
                          "bundle, such as the Nix flake's `webui` package)")
    return folder
