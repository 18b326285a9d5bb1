"""llama.cpp's server-tool surface: `GET /tools` lists the tools the server itself can run, `POST /tools
{tool, params}` runs one. ninfer returns tool calls to its clients and runs none itself, so the registry starts empty
and stays so unless a deployment registers a tool in Python (`ToolRegistry.register`). Running a tool that is not
registered answers 200 with llama.cpp's tool-error shape, `{"error": "..."}` naming the tool: llama-ui probes the
file tools on every page load and reads that shape (a 404 left a console error per probe).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request, get, post
from litestar.params import JSONBody

from ninfer.serve.gate import EXEMPT

ToolRunner = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class ServerTool:
    definition: dict[str, Any]  # OpenAI function-tool definition: {"type": "function", "function": {"name", ...}}
    run: ToolRunner
    display_name: str = ""
    writes: bool = False

    @property
    def name(self) -> str:
        return self.definition["function"]["name"]

    def info(self) -> dict[str, Any]:
        """llama-ui's ServerToolInfo."""
        return {"tool": self.name, "display_name": self.display_name or self.name, "type": "server",
                "permissions": {"write": self.writes}, "uses_cwd": False, "definition": self.definition}


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, ServerTool] = {}

    def register(self, tool: ServerTool) -> None:
        self._tools[tool.name] = tool

    def list(self) -> list[ServerTool]:
        return list(self._tools.values())

    def get(self, name: str) -> ServerTool | None:
        return self._tools.get(name)


class ToolCallRequest(msgspec.Struct, kw_only=True):
    tool: str
    params: dict[str, Any] = {}


def _registry(request: Request) -> ToolRegistry:
    return request.app.state.tools


@get("/tools", summary="The tools the server runs itself (none unless registered)")
async def list_tools(request: Request) -> list[dict[str, Any]]:
    return [t.info() for t in _registry(request).list()]


@post("/tools", status_code=200, opt=EXEMPT, summary="Run a registered server tool")
async def run_tool(data: JSONBody[ToolCallRequest], request: Request) -> dict[str, Any]:
    tool = _registry(request).get(data.tool)
    if tool is None:
        return {"error": f"no server tool named {data.tool!r}: ninfer returns tool calls to the client and runs none "
                         "itself"}
    return await tool.run(data.params)


route_handlers = [list_tools, run_tool]
