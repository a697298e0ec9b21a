"""Reasons an agent can act on: what an `Unavailable` from the KV client tells the caller to do."""

from __future__ import annotations

import secrets
import socket

import pytest
from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.engine.opener import KvTarget, sync_client_for
from graph_kvcache_mcp.connectors.engine.reasons import EngineSource
from graph_kvcache_mcp.domain.outcomes import Unavailable
from tests.support.peers import hung_peer

TOKEN = SecretStr("tok-" + secrets.token_hex(8))


def _refusing_url() -> str:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _reason(outcome: object) -> str:
    assert isinstance(outcome, Unavailable)
    assert TOKEN.get_secret_value() not in outcome.reason
    return outcome.reason


@pytest.mark.parametrize("source", ["managed", "default"])
def test_an_unreachable_engine_of_ours_names_the_tool_and_the_command_that_start_it(
    source: EngineSource,
) -> None:
    with SyncKvClient(_refusing_url(), TOKEN, timeout_s=1.0, source=source) as client:
        reason = _reason(client.get("k"))
    assert "not reachable" in reason
    assert "engine_start" in reason and "`graph-kvcache-mcp engine start`" in reason


def test_an_unreachable_configured_engine_points_at_the_setting_not_at_engine_start() -> None:
    with SyncKvClient(_refusing_url(), TOKEN, timeout_s=1.0, source="configured") as client:
        reason = _reason(client.get("k"))
    assert "not reachable" in reason and "EPISTEMIC_GRAPH_KVCACHE_URL" in reason
    assert "engine_start" not in reason


def test_a_timeout_says_after_how_long_and_that_the_engine_may_be_hung() -> None:
    with hung_peer() as (url, _), SyncKvClient(url, TOKEN, timeout_s=0.4, source="managed") as kv:
        reason = _reason(kv.contains("k"))
    assert "timed out after 0.4 s" in reason
    assert "hung or overloaded" in reason and "EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S" in reason
    assert "engine_status" in reason


def test_the_client_opened_for_a_target_knows_where_its_address_came_from() -> None:
    settings = Settings.build(kv_timeout_s=2.5)
    target = KvTarget(_refusing_url(), TOKEN, "managed", data_dir=settings.data_dir)
    client = sync_client_for(target, settings)
    assert (client.source, client.timeout_s) == ("managed", 2.5)
