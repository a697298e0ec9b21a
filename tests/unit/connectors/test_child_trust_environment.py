"""The children that talk https to the engine (the lmcache server's L2 adapter, vLLM with our
connector) inherit the CA settings our own clients read, and still none of our secrets."""

from __future__ import annotations

import pytest

from graph_kvcache_mcp.connectors.processes.control import (
    ML_STACK_INHERITED,
    ML_STACK_INHERITED_PREFIXES,
    inherited_environment,
)
from graph_kvcache_mcp.connectors.vllm.platform import child_environment
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/fleet/ca.pem")
    monkeypatch.setenv("SSL_CERT_DIR", "/etc/fleet/certs")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/other.pem")
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", "tok-secret")
    monkeypatch.setenv("GRAPH_KVCACHE_HTTP_TOKEN", "http-secret")


@pytest.mark.usefixtures("environ")
def test_the_lmcache_server_and_vllm_inherit_the_ca_settings_and_no_secret() -> None:
    server = inherited_environment(ML_STACK_INHERITED, ML_STACK_INHERITED_PREFIXES)
    vllm = child_environment(VllmLaunch(model="/m", kv_connector="engine"), {})
    for env in (server, vllm):
        assert env["SSL_CERT_FILE"] == "/etc/fleet/ca.pem"
        assert env["SSL_CERT_DIR"] == "/etc/fleet/certs"
        # No client of ours reads it; passing it would only widen what a child sees.
        assert "REQUESTS_CA_BUNDLE" not in env
        assert "tok-secret" not in env.values() and "http-secret" not in env.values()
