"""The llama.cpp source the peer benchmark builds, cut from the pinned llama-cpp-python sdist on this machine, small
enough to carry to the GPU machine (which has no network and a 64 MiB carry limit; the sdist is 76 MB).

    python bench/peer_prepare.py [--work DIR] [--out .gpu/llama.cpp]

The sdist named in python/ninfer/serve/webui/pin.json (the one the web UI is built from) is taken from DIR, or
fetched there by pip, and its size and sha256 checked (webui/build_llama_ui.py's download_sdist / verify_sdist).
From its vendored llama.cpp only what `llama-bench` with the CPU and CUDA backends builds from is extracted, plus
gguf-py (bench/peer_gguf.py writes the benchmark's files with it): the top-level CMake files, ggml (its core, the CPU
and CUDA backends; not the other backends), src, include, common, vendor, and tools (whose CMakeLists adds every
tool directory; only the server, web UI, cli, tuning and rpc ones are left out, which the peer build's options never
add). PyYAML's pure-Python package (gguf-py imports `yaml`; the GPU machine may lack it) goes into `pylib/`, and
`PEER_SOURCE.json` records the sdist, its sha256 and the llama.cpp commit it vendors (read from the sdist's git
metadata). The tree is also packed as OUT.tar.gz, which is what travels; bench/peer_llamacpp.sh unpacks it.
Prints both sizes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "webui"))

from build_llama_ui import PIN, download_sdist, verify_sdist

VENDOR = "vendor/llama.cpp/"
# Paths under vendor/llama.cpp/ that are kept (a trailing slash keeps a directory), and those dropped from them.
KEEP = ("CMakeLists.txt", "LICENSE", "cmake/", "include/", "src/", "common/", "vendor/", "tools/", "gguf-py/",
        "ggml/CMakeLists.txt", "ggml/cmake/", "ggml/include/", "ggml/src/ggml-cpu/", "ggml/src/ggml-cuda/")
DROP = ("tools/ui/", "tools/server/", "tools/cli/", "tools/tuning/", "tools/rpc/", "gguf-py/tests/")
# The llama.cpp submodule's checked-out commit, as the sdist's git metadata holds it.
SUBMODULE_HEAD = ".git/modules/vendor/llama.cpp/HEAD"


def kept(relative: str) -> bool:
    """Whether a path under vendor/llama.cpp/ belongs to the peer's source. ggml/src keeps its own files (the ggml
    core) and only the CPU and CUDA backend directories."""
    if relative.startswith(DROP):
        return False
    if relative.startswith(KEEP):
        return True
    return relative.startswith("ggml/src/") and "/" not in relative[len("ggml/src/"):]


def extract(sdist: Path, out: Path) -> str:
    """Extracts the kept members into `out` (replacing it); returns the vendored llama.cpp commit."""
    top = sdist.name.removesuffix(".tar.gz") + "/"
    staging = Path(tempfile.mkdtemp(prefix=".peer-", dir=out.parent))
    try:
        with tarfile.open(sdist) as tar:
            members, commit = [], None
            for member in tar:
                name = member.name
                if name == top + SUBMODULE_HEAD:
                    commit = tar.extractfile(member).read().decode().strip()
                elif name.startswith(top + VENDOR) and kept(name[len(top + VENDOR):]) and not member.isdir():
                    members.append(member)
            if commit is None:
                raise SystemExit(f"{sdist.name} has no {SUBMODULE_HEAD}: cannot name the llama.cpp commit")
            tar.extractall(staging, members=members, filter="data")
        shutil.rmtree(out, ignore_errors=True)
        (staging / top / VENDOR).rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return commit


def copy_pyyaml(pylib: Path) -> None:
    """PyYAML's Python sources (not its C extension, built for this interpreter; PyYAML falls back to pure Python)."""
    import yaml

    source = Path(yaml.__file__).parent
    shutil.copytree(source, pylib / "yaml", ignore=shutil.ignore_patterns("*.so", "__pycache__"))


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # The Qwen3.5 GGUF tests keep the same sdist in their pytest cache, so one download serves both.
    parser.add_argument("--work", type=Path, default=ROOT / ".pytest_cache" / "d" / "qwen35-gguf",
                        help="where the sdist is, or is downloaded to")
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu" / "llama.cpp")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sdist = verify_sdist(download_sdist(args.work), PIN["size"], PIN["sha256"])
    commit = extract(sdist, args.out)
    copy_pyyaml(args.out / "pylib")
    record = {"sdist": sdist.name, "sha256": PIN["sha256"], "llama_cpp_commit": commit}
    (args.out / "PEER_SOURCE.json").write_text(json.dumps(record, indent=1) + "\n")
    packed = args.out.with_name(args.out.name + ".tar.gz")
    with tarfile.open(packed, "w:gz") as tar:
        tar.add(args.out, arcname=args.out.name)
    print(f"{args.out}: {tree_bytes(args.out) / 2**20:.1f} MiB from {sdist.name} (llama.cpp {commit[:9]}); "
          f"{packed}: {packed.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
