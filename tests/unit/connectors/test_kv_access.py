"""The server state picks one KV access policy from the settings, once."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.access import ConfiguredKvAccess
from graph_kvcache_mcp.connectors.engine.managed_access import ManagedKvAccess
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import EngineProcessError
from graph_kvcache_mcp.state import AppState


async def test_a_configured_url_gets_the_configured_policy_which_starts_and_stops_nothing(
    tmp_path: Path,
) -> None:
    url = "http://127.0.0.1:9"
    state = AppState(Settings.build(kv_url=url, kv_token="t0ken", data_dir=tmp_path))
    access = state.kv
    assert isinstance(access, ConfiguredKvAccess)
    assert (access.source, access.label, access.info().base_url) == ("configured", url, url)
    assert access.token() == SecretStr("t0ken")
    for refused in (access.start_engine(), access.stop_engine(force=True)):
        with pytest.raises(EngineProcessError, match="EPISTEMIC_GRAPH_KVCACHE_URL"):
            await refused
    client = await access.connect()
    assert not isinstance(client, Unavailable) and client.base_url == url
    assert await access.connect() is client  # one client for the server's life
    await state.aclose()
    assert not (tmp_path / "engine").exists()


async def test_without_a_url_the_managed_policy_is_chosen_and_creates_nothing_yet(
    tmp_path: Path,
) -> None:
    state = AppState(Settings.build(data_dir=tmp_path))
    assert isinstance(state.kv, ManagedKvAccess)
    info = state.kv.info()
    assert (info.source, info.base_url, info.holds_lease) == ("managed", None, False)
    assert state.kv.label == f"managed engine in {tmp_path}"
    await state.aclose()
    assert not (tmp_path / "engine").exists()
