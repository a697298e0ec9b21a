"""The /metrics connector's edges: URL policy, body cap, non-vLLM answers (peers are doubles)."""

from __future__ import annotations

import httpx2
import pytest

from graph_kvcache_mcp.connectors.vllm.metrics import (
    VllmMetricsClient,
)
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.endpoint import VllmEndpoint
from graph_kvcache_mcp.domain.vllm.metrics import MetricsSnapshot, UnknownModel
from graph_kvcache_mcp.errors import ConfigError
from tests.support.expositions import CAPTURED_MODEL, captured

URL = "http://127.0.0.1:8000/metrics"


def peer(status: int, body: str) -> httpx2.AsyncClient:
    """A stand-in server that answers every request with `status` and `body`."""

    def handler(_request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, text=body)

    return httpx2.AsyncClient(transport=httpx2.MockTransport(handler))


def test_metrics_url_sits_beside_the_openai_routes() -> None:
    assert (
        VllmEndpoint.of("http://127.0.0.1:8000/v1").metrics_url == "http://127.0.0.1:8000/metrics"
    )
    assert VllmEndpoint.of("http://localhost:9000").metrics_url == "http://localhost:9000/metrics"
    assert VllmEndpoint.of("https://vllm.example.com/v1/").root == "https://vllm.example.com:443"
    assert VllmEndpoint.of("http://localhost:9000").api_base == "http://localhost:9000/v1"


def test_the_metrics_url_keeps_an_approved_base_urls_scheme_and_refuses_a_malformed_one() -> None:
    # Settings approve the transport (plain http only to loopback or listed hosts).
    assert VllmEndpoint.of("http://10.1.2.3:8000/v1").metrics_url == "http://10.1.2.3:8000/metrics"
    with pytest.raises(ConfigError, match="http"):
        VllmEndpoint.of("ftp://10.1.2.3/v1")


async def test_a_capture_served_by_a_peer_becomes_a_timestamped_snapshot() -> None:
    async with peer(200, captured()) as http:
        snapshot = await VllmMetricsClient(http, URL).snapshot(CAPTURED_MODEL)
    assert isinstance(snapshot, MetricsSnapshot)
    assert snapshot.prefix_cache_hits_tokens == 3008 and snapshot.scraped_at is not None


async def test_a_body_over_the_cap_is_refused_not_parsed() -> None:
    async with peer(200, captured()) as http:
        outcome = await VllmMetricsClient(http, URL, max_body_bytes=4096).snapshot()
    assert isinstance(outcome, Unavailable) and "4,096 bytes" in outcome.reason


async def test_a_garbage_peer_reads_as_unavailable() -> None:
    async with peer(200, "<html>not metrics</html>") as http:
        empty = await VllmMetricsClient(http, URL).snapshot()
    async with peer(200, 'vllm:prefix_cache_hits_total{model_name="m"} abc\n') as http:
        broken = await VllmMetricsClient(http, URL).snapshot()
    async with peer(404, "no") as http:
        missing = await VllmMetricsClient(http, URL).snapshot()
    assert isinstance(empty, Unavailable) and "no vLLM series" in empty.reason
    assert isinstance(broken, Unavailable) and "not a Prometheus exposition" in broken.reason
    assert isinstance(missing, Unavailable) and missing.status == 404


async def test_an_unknown_model_is_the_callers_mistake() -> None:
    async with peer(200, captured()) as http:
        with pytest.raises(UnknownModel, match=CAPTURED_MODEL):
            await VllmMetricsClient(http, URL).snapshot("other")
