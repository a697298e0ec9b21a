"""LMCache 0.5.6 itself accepts the generated in-process YAML and the --l2-adapter JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.lmcache import REPO, require_lmcache

pytestmark = pytest.mark.lmcache

PROBE = """
import json, sys
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter import (
    NativePluginL2AdapterConfig,
)
config = LMCacheEngineConfig.from_file(sys.argv[1])
adapter = NativePluginL2AdapterConfig.from_dict(json.load(open(sys.argv[2])))
print(json.dumps({
    "chunk_size": config.chunk_size,
    "remote_storage_plugins": config.remote_storage_plugins,
    "extra_config": config.extra_config,
    "pre_caching_hash_algorithm": config.pre_caching_hash_algorithm,
    "adapter": [adapter.module_path, adapter.class_name, adapter.adapter_params,
                adapter.max_capacity_gb],
}))
"""


def test_lmcache_loads_the_generated_yaml_and_adapter_json(tmp_path: Path) -> None:
    require_lmcache()
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    result = subprocess.run(
        [
            str(REPO / ".venv-lmcache" / "bin" / "python"),
            str(probe),
            str(REPO / "connectors" / "lmcache-inprocess.yaml"),
            str(REPO / "connectors" / "lmcache-mp.l2-adapter.json"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["chunk_size"] == 256
    assert loaded["remote_storage_plugins"] == ["graphkv"]
    extra = loaded["extra_config"]
    assert extra["remote_storage_plugin.graphkv.module_path"] == (
        "graph_kvcache_mcp.plugins.lmcache.remote"
    )
    assert extra["remote_storage_plugin.graphkv.class_name"] == "EngineRemoteConnector"
    assert extra["graphkv.base_url"] == "http://127.0.0.1:9130"
    assert loaded["pre_caching_hash_algorithm"] == "sha256_cbor"
    module, class_name, params, capacity = loaded["adapter"]
    assert (module, class_name) == ("graph_kvcache_mcp.plugins.lmcache.l2", "EngineL2Client")
    assert params["base_url"] == "http://127.0.0.1:9130" and capacity == 0
