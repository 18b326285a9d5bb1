"""Builds the pinned llama-ui bundle (llama.cpp's web UI) and installs it where `ninfer-serve --webui` finds it.

    python webui/build_llama_ui.py [--dest DIR] [--work DIR]

Steps, each checked: `pip download` the exact sdist named in python/ninfer/serve/webui/pin.json (`--no-binary :all:
--no-deps`), verify its size and sha256, extract only the UI folder, apply ninfer's patches to it
(python/ninfer/serve/webui/patches/*.patch, in name order, each of which must apply cleanly), check that its
lockfile pins every package by `resolved` URL and `integrity` hash (what Nix's importNpmLock needs) and holds the
pin's `lockfile_entries` packages (the count goes into the bundle as LOCKFILE_RECORD), `npm ci && npm run build`
there, and copy `dist/` to DEST (default: the user cache, see ninfer.serve.webui_bundle, whose folder name carries
the pin and the patches' digest). A bundle already installed there, with its LOCKFILE_RECORD, is kept: the build
runs once per pin and patch set. A check that fails stops the build with a message saying what
it found and what the pin says (tests/packaging/test_build_llama_ui.py)."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))  # run from a checkout without installing

from ninfer.serve.webui_bundle import PIN, bundle_dir, ui_patches  # noqa: E402


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class BuildRefused(Exception):
    """An input that fails its check: the build stops with this message (and nothing is installed)."""


def download_sdist(work: Path) -> Path:
    """The pinned sdist in `work`, fetched by pip unless it is there already (unchecked: see verify_sdist)."""
    sdist = work / PIN["sdist"]
    if not sdist.exists():
        # --no-build-isolation: pip reads the sdist's metadata with the build tools already here instead of
        # building its whole build-dependency tree from source (which --no-binary :all: would otherwise ask for).
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
                        "--no-build-isolation", "--dest", str(work), f"{PIN['pypi_package']}=={PIN['version']}"],
                       check=True)
    return sdist


def verify_sdist(sdist: Path, size: int, sha256: str) -> Path:
    """Refuses (and deletes, so the next run fetches it again) an sdist whose size or sha256 is not the pin's."""
    actual_size, digest = sdist.stat().st_size, _sha256(sdist)
    if actual_size != size or digest != sha256:
        sdist.unlink()
        raise BuildRefused(f"{sdist.name} is {actual_size} bytes with sha256 {digest}; the pin says {size} bytes, "
                           f"{sha256}: refusing it")
    return sdist


def extract_ui(sdist: Path, work: Path, ui_dir: str) -> Path:
    """Extracts the sdist's `ui_dir` (without any node_modules it may carry) under work/src; returns its path."""
    prefix = f"{sdist.name.removesuffix('.tar.gz')}/{ui_dir}/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and "/node_modules/" not in m.name]
        if not members:
            raise BuildRefused(f"{sdist.name} has no {ui_dir}")
        tar.extractall(work / "src", members=members, filter="data")
    return work / "src" / prefix


def apply_patches(ui: Path, patches: list[Path]) -> None:
    """Applies each patch to the extracted UI (`patch -p1`); refuses the build at the first that does not apply
    cleanly (no fuzz, no reversed or already-applied hunks), naming it and what `patch` said."""
    if patches and shutil.which("patch") is None:
        raise BuildRefused("`patch` is not installed: install Debian's `patch` package, then run `make webui` again")
    for patch in patches:
        done = subprocess.run(["patch", "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch",
                               "-i", str(patch)], check=False, cwd=ui, capture_output=True, text=True)
        if done.returncode != 0:
            said = " ".join((done.stdout + done.stderr).split())
            raise BuildRefused(f"{patch.name} does not apply to the pinned UI source: {said}")


LOCKFILE_RECORD = "ninfer-lockfile.json"


def check_lockfile(ui: Path, expected_entries: int) -> dict:
    """Every package of the UI's package-lock.json carries `resolved` and `integrity` (links and the root excepted),
    and there are as many as the pin says; refuses the build otherwise. Returns the record written into the
    bundle."""
    packages = json.loads((ui / "package-lock.json").read_text())["packages"]
    pinned = {name: entry for name, entry in packages.items() if name and not entry.get("link")}
    unpinned = sorted(name for name, entry in pinned.items() if not ("resolved" in entry and "integrity" in entry))
    if unpinned:
        raise BuildRefused(f"{len(unpinned)} lockfile entries lack resolved/integrity: {unpinned[:5]}")
    if len(pinned) != expected_entries:
        raise BuildRefused(f"the lockfile has {len(pinned)} package entries; the pin says {expected_entries}")
    return {"lockfile": f"{PIN['ui_dir']}/package-lock.json", "entries": len(pinned), "unpinned": unpinned}


def require_npm() -> None:
    """Refuses the build up front (before the download) when there is no npm to run it."""
    if shutil.which("npm") is None:
        raise BuildRefused("npm is not installed (no `npm` on PATH): install Debian's `npm` package (`make "
                           "system-deps` does, as root) or Node.js with npm, then run `make webui` again")


def build(ui: Path) -> Path:
    for cmd in (["npm", "ci", "--no-audit", "--no-fund"], ["npm", "run", "build"]):
        print(f"build_llama_ui: {' '.join(cmd)} in {ui}", file=sys.stderr, flush=True)
        subprocess.run(cmd, cwd=ui, check=True)
    dist = ui / "dist"
    if not (dist / "index.html").is_file():
        raise BuildRefused(f"npm run build wrote no {dist}/index.html")
    return dist


def build_bundle(dest: Path, work: Path) -> None:
    """Fetches, checks and builds the pin in `work`, then installs `dist/` at `dest` (an atomic rename)."""
    require_npm()
    ui = extract_ui(verify_sdist(download_sdist(work), PIN["size"], PIN["sha256"]), work, PIN["ui_dir"])
    apply_patches(ui, ui_patches())
    record = check_lockfile(ui, PIN["lockfile_entries"])
    dist = build(ui)
    (dist / LOCKFILE_RECORD).write_text(json.dumps(record))
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(dist, staging)
    stale = dest.with_name(dest.name + ".stale")
    shutil.rmtree(stale, ignore_errors=True)
    if dest.exists():
        dest.rename(stale)
    staging.replace(dest)  # a rename: a half-copied bundle is never served
    shutil.rmtree(stale, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=bundle_dir(), help="where the bundle goes (default: %(default)s)")
    parser.add_argument("--work", type=Path, help="keep the download and the build tree here (default: a temp dir)")
    args = parser.parse_args()
    # A bundle without the lockfile record was built before that check existed: build it again.
    if (args.dest / "index.html").is_file() and (args.dest / LOCKFILE_RECORD).is_file():
        print(f"build_llama_ui: {args.dest} is already built for llama-cpp-python {PIN['version']} and these "
              "patches", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory(prefix="llama-ui-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        try:
            build_bundle(args.dest, work)
        except BuildRefused as refused:
            sys.exit(f"build_llama_ui: {refused}")
    print(f"build_llama_ui: installed {args.dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
