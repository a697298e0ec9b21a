"""A managed CPU vLLM with EngineKVConnector binds its OpenMP threads as it would without one."""

from __future__ import annotations

import pytest

from graph_kvcache_mcp.connectors.vllm.platform import RESERVED_CPUS_ENV, child_environment
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch


def test_the_engine_connector_keeps_vllms_own_core_reservation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(RESERVED_CPUS_ENV, raising=False)
    with_connector = child_environment(VllmLaunch(model="/m", kv_connector="engine"), {})
    without = child_environment(VllmLaunch(model="/m"), {})
    assert with_connector[RESERVED_CPUS_ENV] == "1"  # vLLM's own value without a connector
    assert RESERVED_CPUS_ENV not in without  # vLLM's default applies unchanged


def test_a_reservation_the_user_chose_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RESERVED_CPUS_ENV, "0")
    env = child_environment(VllmLaunch(model="/m", kv_connector="engine"), {})
    assert env[RESERVED_CPUS_ENV] == "0"
