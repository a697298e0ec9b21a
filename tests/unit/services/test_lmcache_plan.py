from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import resolve_kv_target
from graph_kvcache_mcp.services.lmcache.plan import server_environment


def test_references_are_filled_from_the_resolved_engine_and_the_environment(
    tmp_path: Path,
) -> None:
    settings = Settings.build(
        kv_url="http://127.0.0.1:9444", kv_token=SecretStr("tok-1"), data_dir=tmp_path
    )
    plan_env = {
        "PYTHONHASHSEED": "0",
        "EPISTEMIC_GRAPH_KVCACHE_TOKEN": "${EPISTEMIC_GRAPH_KVCACHE_TOKEN}",
        "LMCACHE_RESP_USERNAME": "${LMCACHE_RESP_USERNAME}",
        "LMCACHE_RESP_PASSWORD": "${LMCACHE_RESP_PASSWORD}",
    }
    engine = resolve_kv_target(settings)
    env = server_environment(plan_env, engine, {"LMCACHE_RESP_USERNAME": "alice"})
    assert env == {
        "PYTHONHASHSEED": "0",
        "EPISTEMIC_GRAPH_KVCACHE_TOKEN": "tok-1",
        "LMCACHE_RESP_USERNAME": "alice",
    }
