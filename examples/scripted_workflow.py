"""A scripted agent workflow: drive graph-kvcache-mcp over stdio with the MCP SDK's `Client`.

    python examples/scripted_workflow.py            # uses your environment's engine settings
    GRAPH_KVCACHE_DATA_DIR=/tmp/kv python examples/scripted_workflow.py

Steps: kv_stats -> kv_put -> kv_get -> kv_probe, each printed with its result. With
EPISTEMIC_GRAPH_KVCACHE_URL (+ _TOKEN) set, the server talks to that engine; with nothing set it
starts a managed local engine and stops it again when this script disconnects.
"""

from __future__ import annotations

import base64
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

KEY = "example:greeting"
VALUE = b"hello from a scripted MCP workflow"


def server_command() -> StdioServerParameters:
    """The console script next to this interpreter (or on PATH), with our settings passed on."""
    script = Path(sys.executable).with_name("graph-kvcache-mcp")
    command = str(script) if script.exists() else shutil.which("graph-kvcache-mcp")
    if command is None:
        sys.exit("graph-kvcache-mcp is not installed: pip install graph-kvcache-mcp")
    # The SDK passes only a safe minimum of the environment to the server (PATH, HOME, ...):
    # hand over the engine and server settings explicitly.
    settings = {
        name: value
        for name, value in os.environ.items()
        if name.startswith(("EPISTEMIC_GRAPH_KVCACHE_", "GRAPH_KVCACHE_"))
    }
    return StdioServerParameters(command=command, args=[], env=settings)


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    print(f"\n>>> {tool} {arguments}")
    result = await client.call_tool(tool, arguments)
    if result.is_error or result.structured_content is None:
        text = " ".join(getattr(block, "text", "") for block in result.content)
        raise SystemExit(f"{tool} failed: {text}")
    return dict(result.structured_content)


async def main() -> None:
    async with Client(server_command()) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        print(f"connected ({client.protocol_version}); tools: {', '.join(names)}")

        stats = await call(client, "kv_stats", {})
        if not stats["reachable"]:
            raise SystemExit(f"store unreachable: {stats['reason']}")
        print(f"<<< {stats['backend']} backend at {stats['base_url']}")

        put = await call(
            client, "kv_put", {"key": KEY, "value_b64": base64.b64encode(VALUE).decode()}
        )
        print(f"<<< {put['state']} ({put['size_bytes']} bytes, sha256 {put['sha256'][:12]}...)")
        if put["note"]:
            print(f"    note: {put['note']}")

        got = await call(client, "kv_get", {"keys": [KEY], "include_value": True})
        entry = got["results"][0]
        value = base64.b64decode(entry["value_b64"]) if entry["value_b64"] else b""
        print(f"<<< hit={entry['hit']} value={value!r} (matches: {value == VALUE})")

        probe = await call(client, "kv_probe", {"samples": 10})
        for check in probe["checks"]:
            print(f"<<< [{'ok' if check['passed'] else 'FAIL'}] {check['name']}: {check['detail']}")
        if not probe["passed"]:
            raise SystemExit("\nsome checks failed")
        print("\nall checks passed")


if __name__ == "__main__":
    anyio.run(main)
