"""`ninfer-serve --webui-dir DIR` and `ninfer-serve --webui` through the CLI's own argument handling and app
construction (tests/live_servers.py `serve_cli`; the browser tests hand the bundle to create_app directly), over plain
HTTP: the bundle's index.html at `/` and its assets beside it, the API unchanged; and the one-line errors when there
is no bundle to serve."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from live_servers import artifact_for, serve_cli


@pytest.fixture(scope="module")
def model(pytestconfig, smollm2_gguf) -> str:
    """A model argument for the CLI (nothing is loaded: these tests request no generation)."""
    return str(artifact_for(pytestconfig, smollm2_gguf))


def write_bundle(folder: Path, title: str) -> dict[str, bytes]:
    """A small UI bundle: its files by URL path."""
    files = {"/": f"<!doctype html><title>{title}</title><script src=\"assets/app.js\"></script>".encode(),
             "/assets/app.js": f"console.log({title!r});".encode()}
    (folder / "assets").mkdir(parents=True)
    (folder / "index.html").write_bytes(files["/"])
    (folder / "assets" / "app.js").write_bytes(files["/assets/app.js"])
    return files


def assert_serves(url: str, files: dict[str, bytes]) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        for path, content in files.items():
            response = client.get(path)
            assert response.status_code == 200 and response.content == content, (path, response.status_code)
        assert client.get("/").headers["content-type"].startswith("text/html")
        assert client.get("/assets/missing.js").status_code == 404
        assert client.get("/v1/models").json()["data"]  # the API is still served beside the bundle


def test_webui_dir_serves_that_bundle_at_the_root(model: str, tmp_path: Path) -> None:
    files = write_bundle(tmp_path / "ui", "another-ui")
    with serve_cli([model, "--webui-dir", str(tmp_path / "ui")]) as server:
        assert_serves(server.url, files)


def test_webui_serves_the_bundle_make_webui_installed(model: str, tmp_path: Path, monkeypatch) -> None:
    """`--webui` serves the bundle from where `make webui` installs it (NINFER_WEBUI_DIR points there here)."""
    monkeypatch.setenv("NINFER_WEBUI_DIR", str(tmp_path / "cache"))
    files = write_bundle(tmp_path / "cache", "installed-ui")
    with serve_cli([model, "--webui"]) as server:
        assert_serves(server.url, files)


def test_webui_serves_the_built_llama_ui(model: str, llama_ui_bundle: Path) -> None:
    """The real pinned bundle in the user cache, when `make webui` has built it (skipped otherwise)."""
    files = {"/": (llama_ui_bundle / "index.html").read_bytes(),
             "/_app/version.json": (llama_ui_bundle / "_app" / "version.json").read_bytes()}
    with serve_cli([model, "--webui"]) as server:
        assert_serves(server.url, files)


@pytest.mark.parametrize("option", ["--webui", "--webui-dir"])
def test_no_bundle_to_serve_is_a_one_line_error(model: str, tmp_path: Path, monkeypatch, capsys, option: str) -> None:
    from ninfer.cli.serve import main

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("NINFER_WEBUI_DIR", str(empty))  # --webui: no bundle built there
    argv = [model, "--webui"] if option == "--webui" else [model, "--webui-dir", str(empty)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ninfer-serve: error: ")
    if option == "--webui":  # what docs/router.md promises: what is missing, where, and how to build it
        assert f"bundle is not built: no index.html in {empty}" in err and "`make webui`" in err
        assert "--webui-dir DIR" in err
    else:
        assert err == f"ninfer-serve: error: --webui-dir {empty} has no index.html\n"
