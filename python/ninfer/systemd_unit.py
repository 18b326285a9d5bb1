"""The hardened systemd unit of `ninfer-serve` for a plain Linux install (`ninfer-serve --print-systemd-unit`).

It is the unit nix/unit.nix renders for NixOS, written out by the same rules: the sandbox comes from the one table
both read (systemd_hardening.json), and ExecStart/Environment quoting, key order and list rendering follow
unit.nix's `mkUnit` and `renderUnitFile` so the two agree field for field (tests/packaging checks it).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from ninfer.serve.shutdown import DEFAULT_GRACE_S

# The name under which LoadCredential hands the API key file over; `%d` is the credentials directory.
CREDENTIAL_NAME = "api-key"
STATE_DIRECTORY = "ninfer"
CACHE_DIRECTORY = "ninfer"
# TimeoutStopSec is the shutdown grace plus this: ninfer-serve's 5 s stream-end and 5 s connection waits and 20 s
# to spare, so SIGTERM's graceful shutdown ends its streams before systemd's SIGKILL (nix/unit.nix's
# stopMarginSeconds).
STOP_MARGIN_S = 30

# ExecStart is not a shell line: systemd splits on blanks, honours "..." with C escapes and expands %-specifiers
# and $VARIABLES. Arguments of only these characters go bare; any other is double-quoted with \ " % $ neutralised.
_PLAIN_ARGUMENT = re.compile(r"[A-Za-z0-9_./:=,+@-]+")
_EXEC_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "%": "%%", "$": "$$", "\n": "\\n", "\t": "\\t"})
# Environment= takes "KEY=value" words; % is still a specifier there ($ is not expanded).
_ENVIRONMENT_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "%": "%%", "\n": "\\n"})


@dataclass(frozen=True)
class UnitOptions:
    """The subset of unit.nix's `mkUnit` arguments a command line can give; the rest keep mkUnit's defaults
    (DynamicUser, state and cache directories named ninfer, every GPU visible)."""

    executable: str
    host: str = "127.0.0.1"
    port: int = 8080
    model: str | None = None
    config_file: str | None = None
    log_level: str = "info"
    api_key_file: str | None = None
    webui: bool = False
    webui_dir: str | None = None
    extra_flags: Sequence[str] = field(default_factory=tuple)
    shutdown_grace_s: float = DEFAULT_GRACE_S


def hardening() -> dict[str, Any]:
    """The sandbox settings (systemd key -> value) shared with nix/unit.nix."""
    table = json.loads(
        resources.files("ninfer").joinpath("systemd_hardening.json").read_text(encoding="utf-8")
    )
    return dict(table["settings"])


def escape_exec_argument(argument: str) -> str:
    if _PLAIN_ARGUMENT.fullmatch(argument):
        return argument
    return '"' + argument.translate(_EXEC_ESCAPES) + '"'


def exec_start(options: UnitOptions) -> str:
    argv = [options.executable]
    if options.model is not None:
        argv.append(options.model)
    argv += ["--host", options.host, "--port", str(options.port), "--log-level", options.log_level]
    if options.config_file is not None:
        argv += ["--config", options.config_file]
    if options.webui:
        argv.append("--webui")
    if options.webui_dir is not None:
        argv += ["--webui-dir", options.webui_dir]
    if options.shutdown_grace_s != DEFAULT_GRACE_S:
        grace = options.shutdown_grace_s
        argv += ["--shutdown-grace", str(int(grace)) if grace.is_integer() else repr(grace)]  # whole: as Nix writes it
    argv += list(options.extra_flags)
    words = [escape_exec_argument(a) for a in argv]
    if options.api_key_file is not None:
        words.append(f"--api-key-file %d/{CREDENTIAL_NAME}")  # a specifier: appended unescaped
    return " ".join(words)


def _render_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _render_section(name: str, settings: Mapping[str, Any]) -> str:
    lines = []
    for key in sorted(settings):  # Nix attribute sets are ordered by name
        value = settings[key]
        for item in value if isinstance(value, list) else [value]:
            lines.append(f"{key}={_render_value(item)}")
    return f"[{name}]\n" + "\n".join(lines) + "\n"


def render_unit(options: UnitOptions) -> str:
    """The `.service` file text, as `(import nix/unit.nix).mkUnit { ... }).text` renders it."""
    state_dir, cache_dir = f"/var/lib/{STATE_DIRECTORY}", f"/var/cache/{CACHE_DIRECTORY}"
    # Every cache goes under CacheDirectory: with ProtectSystem=strict nothing else is writable.
    environment = {
        "HOME": state_dir,
        "XDG_CACHE_HOME": cache_dir,
        "CUDA_CACHE_PATH": f"{cache_dir}/cuda",
        "TRITON_CACHE_DIR": f"{cache_dir}/triton",
    }
    service: dict[str, Any] = {
        "Type": "exec",
        "ExecStart": exec_start(options),
        "Restart": "on-failure",
        "RestartSec": 5,
        "TimeoutStopSec": math.ceil(options.shutdown_grace_s) + STOP_MARGIN_S,
        "StateDirectory": STATE_DIRECTORY,
        "StateDirectoryMode": "0700",
        "CacheDirectory": CACHE_DIRECTORY,
        "CacheDirectoryMode": "0700",
        "WorkingDirectory": state_dir,
        "DynamicUser": True,
    }
    if options.api_key_file is not None:
        service["LoadCredential"] = f"{CREDENTIAL_NAME}:{options.api_key_file}"
    service |= hardening()
    service["Environment"] = [
        '"' + f"{name}={environment[name]}".translate(_ENVIRONMENT_ESCAPES) + '"'
        for name in sorted(environment)
    ]
    return "\n".join(
        [
            _render_section("Unit", {"Description": "ninfer inference server", "After": "network.target"}),
            _render_section("Service", service),
            _render_section("Install", {"WantedBy": "multi-user.target"}),
        ]
    )
