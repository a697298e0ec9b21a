"""The in-process `remote_storage_plugins` connector: config parsing here, and a real LMCache
storage stack (CreateStorageBackends → RemoteBackend-graphkv) from .venv-lmcache."""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest

from graph_kvcache_mcp.domain.lmcache.keys import engine_key
from graph_kvcache_mcp.domain.outcomes import Hit, Stored
from graph_kvcache_mcp.errors import ConfigError
from graph_kvcache_mcp.plugins.lmcache import remote as lmcache_remote
from tests.support.engines import RunningEngine
from tests.support.lmcache import REPO, engine_stats, lmcache_env, require_lmcache

HEADER_BYTES = 28  # LMCache's RemoteMetadata for one KV group


def test_only_graphkv_keys_of_extra_config_are_read() -> None:
    params = lmcache_remote.params_from_extra_config(
        {
            "remote_storage_plugin.graphkv.module_path": "x",
            "graphkv.base_url": "http://127.0.0.1:9130",
            "graphkv.namespace": "fleet-a",
            "save_chunk_meta": False,
        }
    )
    assert params == {"base_url": "http://127.0.0.1:9130", "namespace": "fleet-a"}


def test_a_misspelled_graphkv_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"graphkv\.base_url"):
        lmcache_remote.params_from_extra_config({"graphkv.baseurl": "http://127.0.0.1:1"})


def test_params_fall_back_to_the_environment(
    memory_engine: RunningEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_URL", memory_engine.base_url)
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", memory_engine.token.get_secret_value())
    core, namespace = lmcache_remote.core_from_params({"timeout_s": 2})
    with core:
        assert core.base_url == memory_engine.base_url
        assert namespace == "lmcache"
        assert isinstance(core.put("probe:remote-env", b"ok"), Stored)


def test_the_module_imports_without_lmcache_and_says_what_to_install() -> None:
    if importlib.util.find_spec("lmcache") is not None:  # pragma: no cover - not in .venv
        pytest.skip("lmcache is importable here; the in-process test covers the class")
    with pytest.raises(ImportError, match=r"graph-kvcache-mcp\[lmcache\]"):
        _ = lmcache_remote.EngineRemoteConnector


@pytest.mark.lmcache
def test_lmcache_in_process_backends_round_trip_chunks_through_the_engine(
    memory_engine: RunningEngine,
) -> None:
    require_lmcache()
    before = engine_stats(memory_engine)
    result = subprocess.run(
        [
            str(REPO / ".venv-lmcache" / "bin" / "python"),
            "-m",
            "tests.support.lmcache_inprocess_probe",
            memory_engine.base_url,
            "inproc-test",
        ],
        cwd=REPO,
        env=lmcache_env(memory_engine),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["backends"] == ["LocalCPUBackend", "RemoteBackend-graphkv"]
    assert report["contained"] == [True, True, True]
    assert report["absent"] is False
    assert report["equal"] == [True, True, True]
    assert report["shapes_kept"] == [True, True, True]
    after = engine_stats(memory_engine)
    with memory_engine.sync_client() as kv:
        for key in report["keys"]:
            block = kv.get(engine_key(key, namespace="inproc-test"))
            assert isinstance(block, Hit)
            assert len(block.value) == HEADER_BYTES + report["chunk_bytes"]
    assert (after.unique_blocks or 0) - (before.unique_blocks or 0) == 3
    assert memory_engine.token.get_secret_value() not in result.stderr
