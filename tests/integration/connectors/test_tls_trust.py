"""A private CA (the fleet's) behind https: our clients name a certificate failure as such, with
the CAs they trusted and the fix, trust the CA once SSL_CERT_FILE names it, and the LMCache L2
adapter logs why its stores failed, once per reason. The engine is real; the TLS edge in front
of it is a test double (`tests/support/tls_edge.py`), its CA made here."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.connectors.vllm.health import probe_server
from graph_kvcache_mcp.domain.outcomes import Hit, Stored, Unavailable
from graph_kvcache_mcp.plugins.lmcache.l2 import EngineL2Client, wait_for_completion
from tests.support.engines import RunningEngine
from tests.support.tls_edge import EdgePki, make_test_pki, tls_forwarder

KEY = "tls-trust-check"
LMCACHE_KEY = "Qwen/Qwen3-8B@01000100@0@" + "ab" * 32


@pytest.fixture
def pki(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EdgePki:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    return make_test_pki(tmp_path)


@pytest.fixture
def edge(pki: EdgePki, memory_engine: RunningEngine) -> Iterator[str]:
    port = int(memory_engine.base_url.rsplit(":", 1)[1])
    with tls_forwarder(pki, port) as tls_port:
        yield f"https://127.0.0.1:{tls_port}"


def assert_named(reason: str, trusted: str) -> None:
    assert "certificate verify failed" in reason
    assert "ConnectError" not in reason
    assert trusted in reason and "SSL_CERT_FILE" in reason


def test_the_engine_client_names_an_untrusted_certificate_then_trusts_the_ca(
    edge: str, pki: EdgePki, memory_engine: RunningEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    untrusting = SyncKvClient(edge, memory_engine.token, timeout_s=10.0)
    try:
        refused = untrusting.put(KEY, b"x" * 64)
    finally:
        untrusting.close()
    assert isinstance(refused, Unavailable)
    assert_named(refused.reason, "the system store")
    assert memory_engine.token.get_secret_value() not in refused.reason

    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_file))
    trusting = SyncKvClient(edge, memory_engine.token, timeout_s=10.0)
    try:
        assert isinstance(trusting.put(KEY, b"y" * 64), Stored)
        got = trusting.get(KEY)
    finally:
        trusting.close()
    assert isinstance(got, Hit) and got.value == b"y" * 64


def test_the_l2_adapter_logs_why_its_stores_fail_once_per_reason(
    edge: str,
    pki: EdgePki,
    memory_engine: RunningEngine,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = memory_engine.token.get_secret_value()
    caplog.set_level(logging.WARNING, logger="graph_kvcache_mcp.plugins.lmcache.l2")
    client = EngineL2Client(base_url=edge, token=token, num_workers=1, max_connections=2)
    try:
        for _ in range(3):
            done = wait_for_completion(client, client.submit_batch_set([LMCACHE_KEY], [b"z" * 256]))
            assert done is not None
            _, ok, error, _ = done
            assert not ok and "certificate verify failed" in error
    finally:
        client.close()
    logged = [
        r.getMessage() for r in caplog.records if "certificate verify failed" in r.getMessage()
    ]
    assert len(logged) == 1, logged
    assert "LMCache L2 store failed" in logged[0] and token not in logged[0]

    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_file))
    client = EngineL2Client(base_url=edge, token=token, num_workers=1, max_connections=2)
    try:
        done = wait_for_completion(client, client.submit_batch_set([LMCACHE_KEY], [b"z" * 256]))
    finally:
        client.close()
    assert done is not None and done[1] is True, done


def test_the_vllm_client_and_probe_name_an_untrusted_certificate(edge: str, pki: EdgePki) -> None:
    async def health() -> bool | Unavailable:
        async with VllmClient(edge + "/v1", timeout_s=10.0) as client:
            return await client.health()

    answer = anyio.run(health)
    assert isinstance(answer, Unavailable)
    assert_named(answer.reason, "the system store")
    assert answer.reason.startswith(f"vLLM at {edge} was not trusted")

    healthy, _, reason = probe_server(edge + "/v1", timeout_s=10.0)
    assert not healthy and reason is not None
    assert_named(reason, "the system store")


def test_the_reason_names_the_ca_file_that_was_used(
    edge: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory_engine: RunningEngine
) -> None:
    (tmp_path / "other").mkdir()
    other = make_test_pki(tmp_path / "other")  # a CA that did not sign the edge's certificate
    monkeypatch.setenv("SSL_CERT_FILE", str(other.ca_file))
    client = SyncKvClient(edge, memory_engine.token, timeout_s=10.0)
    try:
        refused = client.contains(KEY)
    finally:
        client.close()
    assert isinstance(refused, Unavailable)
    assert_named(refused.reason, f"SSL_CERT_FILE={other.ca_file}")
