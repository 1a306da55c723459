"""Drive `keel serve --http` with the official Python MCP SDK's client.

Usage: python_client.py URL FILE, where FILE, named relative to the server's
workspace, holds `one two\\nthree\\n`. Both ways the SDK connects are tried:
the `initialize` handshake (a session, 2025-11-25 and earlier) and
`server/discover` (stateless, 2026-07-28). Prints one JSON line of what it
saw; exits non-zero naming the first thing that differed.
"""

import asyncio
import json
import sys
from importlib.metadata import version

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

# What `wc` counts in the file the test writes.
COUNTS = {"lines": 2, "words": 3, "bytes": 14}


class Mismatch(Exception):
    pass


def expect(what, seen, wanted):
    if seen != wanted:
        raise Mismatch(f"{what}: expected {wanted!r}, got {seen!r}")


def text_of(result):
    return "".join(block.text for block in result.content if block.type == "text")


async def check(url, path, connect):
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await getattr(session, connect)()
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        expect(f"{connect}: tools listed", sorted({"echo", "wc"} & tools.keys()), ["echo", "wc"])
        schema = tools["wc"].output_schema or {}
        properties = sorted(schema.get("properties", {}))
        expect(f"{connect}: wc's outputSchema properties", properties, ["bytes", "lines", "path", "words"])

        echo = await session.call_tool("echo", {"text": "héllo"})
        expect(f"{connect}: echo's isError", echo.is_error, False)
        expect(f"{connect}: echo's text", text_of(echo), "héllo")

        wc = await session.call_tool("wc", {"file_path": path})
        expect(f"{connect}: wc's isError", wc.is_error, False)
        expect(f"{connect}: wc's structuredContent", wc.structured_content, {"path": path, **COUNTS})

        unknown = await session.call_tool("no_such_tool", {})
        expect(f"{connect}: an unknown tool's isError", unknown.is_error, True)
        expect(f"{connect}: an unknown tool's text", text_of(unknown), "No such tool: no_such_tool")
        again = await session.call_tool("echo", {"text": "still here"})
        expect(f"{connect}: echo after the error", text_of(again), "still here")
        return {
            "protocol_version": session.protocol_version,
            "tools": sorted(tools),
            "echo": text_of(echo),
            "wc": wc.structured_content,
            "unknown_tool_error": text_of(unknown),
        }


async def main(url, path):
    seen = {"sdk": version("mcp")}
    for connect in ("initialize", "discover"):
        seen[connect] = await check(url, path, connect)
    print(json.dumps(seen, ensure_ascii=False))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python_client.py URL FILE")
    try:
        asyncio.run(main(sys.argv[1], sys.argv[2]))
    except* Mismatch as group:
        while isinstance(group, BaseExceptionGroup):  # nested by the SDK's task groups
            group = group.exceptions[0]
        sys.exit(f"python_client: {group}")
