"""Serving loads only what serving needs: a host waits for start-up (bench: tools/bench_startup.py).

openai, prometheus-client, vLLM, LMCache and the opt-in toolsets load on first use. Checked in a
fresh interpreter, since this test process has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LOADED_ON_FIRST_USE = (
    "openai",
    "prometheus_client",
    "vllm",
    "lmcache",
    "torch",
    "graph_kvcache_mcp.tools.lmcache",
)
SERVE_LIKE_THE_CONSOLE_SCRIPT = """
import json, sys
from pathlib import Path
from graph_kvcache_mcp.cli import main  # what the console script imports
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.server import build_server
build_server(Settings.build(data_dir=Path(sys.argv[1])))
print(json.dumps(sorted(name for name in json.loads(sys.argv[2]) if name in sys.modules)))
"""


def test_building_the_default_server_imports_none_of_the_first_use_modules(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            SERVE_LIKE_THE_CONSOLE_SCRIPT,
            str(tmp_path),
            json.dumps(LOADED_ON_FIRST_USE),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout) == []
