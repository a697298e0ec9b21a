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


def test_the_servers_adapter_gets_the_plain_http_opt_in_its_engine_url_passed(
    tmp_path: Path,
) -> None:
    settings = Settings.build(
        kv_url="http://10.0.0.5:9130",
        kv_token=SecretStr("tok-1"),
        insecure_http_hosts=("10.0.0.0/24",),
        data_dir=tmp_path,
    )
    env = server_environment(
        {"PYTHONHASHSEED": "0"},
        resolve_kv_target(settings),
        {},
        insecure_hosts=settings.insecure_http_hosts,
    )
    assert env["GRAPH_KVCACHE_INSECURE_HTTP_HOSTS"] == "10.0.0.0/24"
    unlisted = Settings.build(kv_url="http://127.0.0.1:9130", data_dir=tmp_path)
    assert "GRAPH_KVCACHE_INSECURE_HTTP_HOSTS" not in server_environment(
        {}, resolve_kv_target(unlisted), {}
    )
