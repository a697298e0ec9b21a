"""The MCP conformance suite (`@modelcontextprotocol/conformance`, run with Node 22 from npm)
against the real HTTP server: every scenario that applies to what this server declares passes.

Scenarios left out, and why (docs/mcp-server.md "Conformance" has the same list):
- tools-call-* , resources-read-*, resources-templates-read, prompts-get-*, json-schema-2020-12,
  elicitation-*, server-sse-*: they call the suite's own fixture tools, resources and prompts
  (`test_simple_text`, `test://static-text`, ...), which only its reference server has.
- logging-set-level, completion-complete, resources-subscribe/unsubscribe: capabilities this
  server does not declare (no `logging`, `completions` or resource `subscribe`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engines import require_in_ci
from tests.support.http_server import HttpServer, http_server

SUITE = "@modelcontextprotocol/conformance@0.1.16"
NODE = "node@22"  # the suite imports fs.globSync, which Node 20 lacks
APPLICABLE = (
    "server-initialize",
    "ping",
    "tools-list",
    "resources-list",
    "prompts-list",
    "dns-rebinding-protection",
)
RESULT = re.compile(r"Passed: (\d+)/(\d+), (\d+) failed")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    if shutil.which("npx") is None:
        require_in_ci("npx (Node.js)")
    data_dir = tmp_path_factory.mktemp("conformance")
    with http_server({"GRAPH_KVCACHE_DATA_DIR": str(data_dir)}, "--no-auth") as up:
        yield up


@pytest.mark.parametrize("scenario", APPLICABLE)
def test_each_applicable_conformance_scenario_passes(
    server: HttpServer, scenario: str, tmp_path: Path
) -> None:
    command = ["npx", "-y", "-p", NODE, "-p", SUITE, "--", "conformance", "server"]
    done = subprocess.run(
        [*command, "--url", server.url, "--scenario", scenario],
        capture_output=True,
        text=True,
        timeout=300,  # the first run downloads Node 22 and the suite
        cwd=tmp_path,
    )
    found = RESULT.search(done.stdout)
    assert found is not None, done.stdout[-2000:] + done.stderr[-2000:]
    passed, total, failed = (int(part) for part in found.groups())
    assert failed == 0 and passed == total > 0, done.stdout[-2000:]
