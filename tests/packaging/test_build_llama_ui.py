"""webui/build_llama_ui.py refuses what does not match its pin, on crafted local inputs (nothing is downloaded): an
sdist of another size or sha256, a lockfile entry without `resolved` or `integrity`, a lockfile of another entry
count; and passes a crafted sdist and lockfile that match."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "webui" / "build_llama_ui.py"
UI_DIR = "vendor/llama.cpp/tools/ui"


def _load_script():
    spec = importlib.util.spec_from_file_location("build_llama_ui", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_llama_ui = _load_script()
BuildRefused = build_llama_ui.BuildRefused


def lockfile(packages: dict[str, dict]) -> dict:
    """A package-lock.json (v3) with the root entry and `packages`."""
    return {"name": "llama-ui", "lockfileVersion": 3, "packages": {"": {"name": "llama-ui"}, **packages}}


def pinned(name: str) -> dict:
    return {"version": "1.0.0", "resolved": f"https://registry.npmjs.org/{name}/-/{name}-1.0.0.tgz",
            "integrity": "sha512-" + hashlib.sha512(name.encode()).hexdigest()}


PACKAGES = {f"node_modules/{n}": pinned(n) for n in ("left-pad", "svelte", "vite")}


def write_sdist(path: Path, lock: dict) -> Path:
    """A gzipped tar laid out like the pinned sdist: the UI folder with its lockfile, plus files outside it and a
    node_modules inside it (neither of which is extracted)."""
    top = path.name.removesuffix(".tar.gz")
    files = {f"{top}/{UI_DIR}/package-lock.json": json.dumps(lock).encode(),
             f"{top}/{UI_DIR}/package.json": b'{"name": "llama-ui"}',
             f"{top}/{UI_DIR}/node_modules/stale/index.js": b"stale",
             f"{top}/setup.py": b"# not the UI"}
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def sdist(tmp_path: Path) -> Path:
    return write_sdist(tmp_path / "llama_cpp_python-0.0.1.tar.gz", lockfile(PACKAGES))


def test_a_matching_sdist_and_lockfile_pass_and_are_recorded(sdist: Path, tmp_path: Path) -> None:
    checked = build_llama_ui.verify_sdist(sdist, sdist.stat().st_size, sha256_of(sdist))
    ui = build_llama_ui.extract_ui(checked, tmp_path / "work", UI_DIR)
    assert sorted(p.name for p in ui.iterdir()) == ["package-lock.json", "package.json"]  # no node_modules
    assert not (tmp_path / "work" / "src" / sdist.name.removesuffix(".tar.gz") / "setup.py").exists()
    record = build_llama_ui.check_lockfile(ui, expected_entries=len(PACKAGES))
    assert record["entries"] == len(PACKAGES) and record["unpinned"] == []


def test_an_sdist_with_another_sha256_is_refused_naming_both_hashes(sdist: Path) -> None:
    actual = sha256_of(sdist)
    pinned_hash = hashlib.sha256(b"the pinned release").hexdigest()
    with pytest.raises(BuildRefused) as refused:
        build_llama_ui.verify_sdist(sdist, sdist.stat().st_size, pinned_hash)
    assert actual in str(refused.value) and pinned_hash in str(refused.value)
    assert not sdist.exists()  # deleted, so the next run fetches it again


def test_an_sdist_of_another_size_is_refused_naming_both_sizes(sdist: Path) -> None:
    size = sdist.stat().st_size
    with pytest.raises(BuildRefused) as refused:
        build_llama_ui.verify_sdist(sdist, size + 1, sha256_of(sdist))
    assert f"is {size} bytes" in str(refused.value) and f"says {size + 1} bytes" in str(refused.value)
    assert not sdist.exists()


@pytest.mark.parametrize("missing", ["integrity", "resolved"])
def test_a_lockfile_entry_without_resolved_or_integrity_is_refused_naming_it(tmp_path: Path, missing: str) -> None:
    loose = {k: v for k, v in pinned("svelte").items() if k != missing}
    (tmp_path / "package-lock.json").write_text(json.dumps(lockfile({**PACKAGES, "node_modules/svelte": loose})))
    with pytest.raises(BuildRefused) as refused:
        build_llama_ui.check_lockfile(tmp_path, expected_entries=len(PACKAGES))
    assert "node_modules/svelte" in str(refused.value) and "node_modules/vite" not in str(refused.value)


def test_a_linked_workspace_entry_needs_no_resolved_or_integrity(tmp_path: Path) -> None:
    (tmp_path / "package-lock.json").write_text(json.dumps(lockfile({**PACKAGES, "node_modules/local": {
        "resolved": "packages/local", "link": True}})))
    assert build_llama_ui.check_lockfile(tmp_path, expected_entries=len(PACKAGES))["entries"] == len(PACKAGES)


@pytest.mark.parametrize("expected", [len(PACKAGES) - 1, len(PACKAGES) + 1])
def test_a_lockfile_of_another_entry_count_is_refused(tmp_path: Path, expected: int) -> None:
    (tmp_path / "package-lock.json").write_text(json.dumps(lockfile(PACKAGES)))
    with pytest.raises(BuildRefused) as refused:
        build_llama_ui.check_lockfile(tmp_path, expected_entries=expected)
    assert f"has {len(PACKAGES)} package entries; the pin says {expected}" in str(refused.value)


def test_the_script_exits_with_the_refusal_and_installs_nothing(tmp_path: Path, monkeypatch) -> None:
    """The whole script on a bad sdist already in --work (so pip is not run): it exits with the refusal's message
    and leaves --dest as it was."""
    work, dest = tmp_path / "work", tmp_path / "bundle"
    work.mkdir()
    bad = write_sdist(work / build_llama_ui.PIN["sdist"], lockfile(PACKAGES))
    monkeypatch.setattr(build_llama_ui, "require_npm", lambda: None)  # (the next test checks it)
    monkeypatch.setattr(sys, "argv", ["build_llama_ui.py", "--work", str(work), "--dest", str(dest)])
    with pytest.raises(SystemExit) as exited:
        build_llama_ui.main()
    message = str(exited.value.code)
    assert message.startswith("build_llama_ui: ") and "refusing it" in message
    assert build_llama_ui.PIN["sha256"] in message
    assert not dest.exists() and not bad.exists()


def test_without_npm_the_script_says_so_before_downloading(tmp_path: Path, monkeypatch) -> None:
    """`make webui` on a machine without npm: one line naming npm and how to get it, and nothing downloaded."""
    work, dest = tmp_path / "work", tmp_path / "bundle"
    monkeypatch.setenv("PATH", str(tmp_path / "no-such-bin"))

    def download(_work: Path) -> Path:
        raise AssertionError("the sdist was downloaded although npm is missing")

    monkeypatch.setattr(build_llama_ui, "download_sdist", download)
    monkeypatch.setattr(sys, "argv", ["build_llama_ui.py", "--work", str(work), "--dest", str(dest)])
    with pytest.raises(SystemExit) as exited:
        build_llama_ui.main()
    message = str(exited.value.code)
    assert message.startswith("build_llama_ui: npm is not installed") and "\n" not in message
    assert "`npm` package" in message and not dest.exists()


def test_the_pins_entry_count_is_the_built_bundles() -> None:
    """The count the build demands is the pinned lockfile's (as the bundle built from it recorded)."""
    from ninfer.serve.webui_bundle import bundle_dir

    record = bundle_dir() / build_llama_ui.LOCKFILE_RECORD
    if not record.is_file():
        pytest.skip(f"llama-ui is not built in {bundle_dir()} (make webui builds it)")
    assert json.loads(record.read_text())["entries"] == build_llama_ui.PIN["lockfile_entries"]
