"""vLLM 0.33 asks the connector's class whether it follows sleep mode's KV cache remap, before
any instance exists (`connector_cls.supports_sleep_mode(kv_transfer_config)`); the device path's
views would go stale, so the answer is no, asked the way vLLM asks it."""

from __future__ import annotations

from graph_kvcache_mcp.plugins.vllm_kv.connector import EngineKVConnector


def test_the_connector_class_refuses_sleep_mode_when_vllm_asks_it() -> None:
    assert EngineKVConnector.supports_sleep_mode(None) is False
