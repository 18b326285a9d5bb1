"""RFC 2397 data URLs as request media arrive in them (`data:image/png;base64,...`). Only base64 payloads are
accepted: media are binary, and a percent-encoded payload is almost always a client bug."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from ninfer.errors import MediaError

_HEADER = re.compile(r"data:(?P<type>[^;,]*)(?P<params>(;[^;,]*)*),", re.IGNORECASE)
_WHITESPACE = re.compile(rb"[ \t\r\n]+")


@dataclass(frozen=True)
class DataUrl:
    media_type: str  # lower case, "" when the URL gives none
    data: bytes


def is_data_url(url: str) -> bool:
    return url[:5].lower() == "data:"


def parse_data_url(url: str, *, part: str, max_bytes: int) -> DataUrl:
    """The payload of a base64 data URL; MediaError naming `part` for anything else, or a payload over
    `max_bytes` (checked before decoding)."""
    header = _HEADER.match(url)
    if header is None:
        raise MediaError(part, "not a data URL (expected data:<type>;base64,<payload>)")
    params = [p.strip().lower() for p in header["params"].split(";") if p.strip()]
    if "base64" not in params:
        raise MediaError(part, "the data URL is not base64-encoded (expected ;base64, before the payload)")
    payload = _WHITESPACE.sub(b"", url[header.end():].encode("ascii", errors="replace"))
    if len(payload) // 4 * 3 > max_bytes:
        raise MediaError(part, f"the payload is over the limit of {max_bytes} bytes")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaError(part, f"the data URL's payload is not valid base64 ({exc})") from None
    return DataUrl(media_type=header["type"].strip().lower(), data=data)
