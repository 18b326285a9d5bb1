"""The serve tests' live servers (tests/live_servers.py), defined here once so that the whole session shares one
server per model: a fixture bound in each test module would be a separate fixture per module, each starting its own
server and engine."""

from __future__ import annotations

from live_servers import qwen35_server, smollm2_server  # noqa: F401 - fixtures
