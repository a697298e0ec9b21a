"""Readiness probes treat a peer that answers garbage as "not ready yet", never as a crash: the
lmcache server's /healthcheck probe and vLLM's /health probe, against test doubles that send
bytes no real server sends (named garbage peers)."""

from __future__ import annotations

import contextlib

import httpx2
import pytest

from graph_kvcache_mcp.connectors.lmcache.readiness import get_json
from tests.support.peers import garbage_peer

GARBAGE = {
    "not HTTP (BadStatusLine)": b"\x00\xffnot http at all\r\n\r\n",
    "a status line only": b"HTTP/1.1 200 OK",
    "a body cut short (IncompleteRead)": b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{}",
    "a header line too long (LineTooLong)": b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n",
    "nothing at all": b"",
}


@pytest.mark.parametrize("case", sorted(GARBAGE))
def test_the_lmcache_health_probe_reads_garbage_as_not_healthy(case: str) -> None:
    with garbage_peer(GARBAGE[case]) as url:
        assert get_json(url + "/healthcheck", timeout_s=5.0) == {}


@pytest.mark.parametrize("case", sorted(GARBAGE))
def test_the_vllm_health_probe_s_client_raises_only_httperror_on_garbage(case: str) -> None:
    # vllm/process.py counts httpx2.HTTPError as "not healthy yet"; any other exception fails.
    with (
        garbage_peer(GARBAGE[case]) as url,
        httpx2.Client(timeout=5.0) as http,
        contextlib.suppress(httpx2.HTTPError),
    ):
        http.get(url + "/health")
