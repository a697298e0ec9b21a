"""Serving starts without the vLLM client: openai loads on the first vLLM call, not before.

Run in a fresh interpreter, since this test process has long imported everything.
"""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from graph_kvcache_mcp.cli import build_parser
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.state import AppState

build_parser()
build_server(Settings.build())
AppState(Settings.build())
print("before", "openai" in sys.modules)
from graph_kvcache_mcp.connectors.vllm.access import open_client
open_client(Settings.build())
print("after", "openai" in sys.modules)
"""


def test_the_server_and_cli_load_without_openai_until_a_client_is_made() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["before", "False", "after", "True"]
