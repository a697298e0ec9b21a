"""A real `lmcache server` that no data dir of ours started, given to the code only as a
configured URL (`lmcache_url`, what GRAPH_KVCACHE_LMCACHE_URL sets): the traces' L1/L2 split,
kv stats' L2 counters and diagnosis read that server, and say what of its process they cannot.

The data dir is empty, so a read that still looked for the managed server would find none.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import open_kv_client
from graph_kvcache_mcp.connectors.lmcache.admin_http import LmcacheHttp
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters
from graph_kvcache_mcp.services.diagnosis.stack_check import check_stack, lmcache_facts
from graph_kvcache_mcp.services.kv.stats import kv_stats
from graph_kvcache_mcp.services.stack.runtime import engine_l2_counters, lmcache_target
from graph_kvcache_mcp.services.stack.vllm import open_metered_client
from tests.support.engines import RunningEngine
from tests.support.lmcache import LmcacheServer, running_lmcache_server

pytestmark = pytest.mark.lmcache


@pytest.fixture(scope="module")
def server(
    durable_engine: RunningEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LmcacheServer]:
    with running_lmcache_server(durable_engine, tmp_path_factory.mktemp("lmcache")) as running:
        yield running


def configured(engine: RunningEngine, server: LmcacheServer | None, data_dir: Path) -> Settings:
    """The engine's settings on an empty data dir, calls to a vLLM on 127.0.0.2 (nothing there),
    the lmcache server named by URL when given."""
    vllm_url = f"http://127.0.0.2:{free_port()}/v1"
    return engine.settings.model_copy(
        update={
            "data_dir": data_dir,
            "vllm_base_url": vllm_url,
            "lmcache_url": None if server is None else server.http_url,
        }
    )


async def test_the_trace_split_reads_the_configured_server_and_nothing_without_it(
    durable_engine: RunningEngine, server: LmcacheServer, tmp_path: Path
) -> None:
    async with LmcacheHttp(server.http_url) as direct:
        expected = await direct.counters()
    assert isinstance(expected, LmcacheCounters), expected
    async with open_metered_client(configured(durable_engine, server, tmp_path)) as client:
        assert client.meter.tier is not None
        read = await client.meter.tier.read()
    assert read == expected  # no traffic between the two reads: the same server's counters
    # The same data dir without the setting: the managed server is looked for, and none runs.
    async with open_metered_client(configured(durable_engine, None, tmp_path)) as client:
        assert client.meter.tier is not None
        assert await client.meter.tier.read() is None


async def test_kv_stats_carry_the_counters_of_a_configured_server_writing_to_the_engine(
    durable_engine: RunningEngine, server: LmcacheServer, tmp_path: Path
) -> None:
    settings = configured(durable_engine, server, tmp_path)
    async with LmcacheHttp(server.http_url) as direct:
        expected = await direct.counters()
    async with open_kv_client(settings) as kv:
        out = await kv_stats(kv, settings)
    assert out.reachable and out.lmcache == expected
    # Its /config names the engine its L2 writes to: for any other engine it is not shown.
    target = lmcache_target(settings)
    assert await engine_l2_counters(target, durable_engine.base_url + "/") == expected
    assert await engine_l2_counters(target, f"http://127.0.0.1:{free_port()}") is None


async def test_diagnosis_checks_the_configured_server_and_names_what_it_cannot_read(
    durable_engine: RunningEngine, server: LmcacheServer, tmp_path: Path
) -> None:
    settings = configured(durable_engine, server, tmp_path)
    async with open_metered_client(settings) as client:
        out = await check_stack(settings, client)
    assert ("lmcache", server.http_url, True) in [
        (c.component, c.target, c.reachable) for c in out.checked
    ]
    hidden = [f for f in out.findings if f.id == "runtime_not_readable"]
    assert [(f.component, f.severity) for f in hidden] == [("lmcache", "info")]
    assert hidden[0].evidence.startswith(f"not managed here: {server.http_url} ")
    assert "PYTHONHASHSEED and log" in hidden[0].evidence
    # What its own API tells is read: the test server runs --supported-transfer-mode auto.
    facts = await lmcache_facts(server.http_url, tmp_path)
    rpc_port = int(server.rpc_url.rsplit(":", 1)[-1])
    assert (facts.transfer_mode, facts.rpc_port, facts.hash_seed) == ("auto", rpc_port, None)
