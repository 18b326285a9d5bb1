"""A bounded, in-memory store of Responses API responses, for `previous_response_id`, `GET /v1/responses/{id}`
and `/input_items`.

It lives in the server process (nothing is written to disk) and keeps the most recently *used* responses: storing
or reading one moves it to the front, and the oldest is dropped past `capacity`. A conversation that goes on via
`previous_response_id` therefore stays, while abandoned ones age out. Each entry keeps what a follow-up needs: the
response object as returned, its input items (with ids), and the whole conversation so far as chat messages.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

DEFAULT_CAPACITY = 512


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object, as the client received it
    input_items: list[dict[str, Any]]  # this request's input items (not the previous responses'), with ids
    conversation: list[dict[str, Any]]  # chat messages: earlier turns, this input, and this response's output


class ResponseStore:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("a response store holds at least one response")
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()  # handlers run on one loop, but the store is cheap to make thread-safe

    def put(self, entry: StoredResponse) -> None:
        with self._lock:
            self._entries[entry.response["id"]] = entry
            self._entries.move_to_end(entry.response["id"])
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._entries)
