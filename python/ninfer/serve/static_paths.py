"""What a request path must be before the web UI's static files router looks it up on disk.

Litestar's static router hands the decoded path to the filesystem as is, so a NUL byte (`/%00`) raised ValueError
and a 5,000-character name OSError (ENAMETOOLONG): 500s, without a key. `check_static_path` is the router's
`before_request` hook: a path no file could have is answered before any filesystem call, 400 for bytes no file name
may hold (NUL and other control characters, invalid UTF-8), 404 for a name longer than a filesystem allows.
Traversal (`..`, encoded or not) is Litestar's own check: it resolves the path and refuses anything outside the
bundle with a 404; tests/serve/test_static_paths.py holds it to that.
"""

from __future__ import annotations

from litestar import Request
from litestar.exceptions import NotFoundException, ValidationException

MAX_NAME_BYTES = 255  # NAME_MAX on Linux filesystems
MAX_PATH_BYTES = 4095  # PATH_MAX, less its terminating NUL


def _unservable_character(path: str) -> str | None:
    for char in path:
        if char == "\ufffd":  # what invalid UTF-8 in the URL decodes to
            return "the path is not valid UTF-8"
        if ord(char) < 0x20 or ord(char) == 0x7F:
            return f"the path holds the control character U+{ord(char):04X}"
    return None


async def check_static_path(request: Request) -> None:
    path = request.url.path
    problem = _unservable_character(path)
    if problem is not None:
        raise ValidationException(detail=problem)
    encoded = path.encode("utf-8", "surrogateescape")
    if len(encoded) > MAX_PATH_BYTES or any(len(part) > MAX_NAME_BYTES for part in encoded.split(b"/")):
        raise NotFoundException(detail="no file has a name that long")
