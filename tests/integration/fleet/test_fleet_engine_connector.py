"""fleet where for a vLLM on `EngineKVConnector`, on the real stack (the durable engine, CPU vLLM
with KV events and our connector): the connector publishes its KV identity, the fleet view
computes the prompt's block keys from it and HEADs them on the engine, and every prediction is
checked against what vLLM then reports and the engine's /kv/stats.

- a never-sent prompt: the engine tier holds 0, trusted, and the check reads nothing;
- a prompt sent, then vLLM restarted (its own cache empty): the engine tier holds every full
  block, `cached_tokens` is what the connector loads (never the block with the last token), and
  the repeat reports exactly that, read from the engine.

vLLM starts: 1 (+ 1 managed restart).
"""

from __future__ import annotations

import json
import stat
import tempfile
from pathlib import Path

import anyio
import httpx
import pytest

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection
from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats
from graph_kvcache_mcp.domain.fleet.fleet_file import Fleet, FleetInstance
from graph_kvcache_mcp.domain.vllm.kv_blocks import KEY_SCHEME_VERSION
from graph_kvcache_mcp.domain.vllm.kv_identity_file import IDENTITY_FILE_NAME
from graph_kvcache_mcp.services.fleet.operations import where_cached
from graph_kvcache_mcp.services.fleet.tiers import ENGINE_BLOCKS_SOURCE, TierSources
from graph_kvcache_mcp.services.fleet.views import InstanceWhere
from tests.support.engines import RunningEngine
from tests.support.vllm import MODEL_NAME, READY_TIMEOUT_S
from tests.support.vllm_connector import ConnectorVllm, connector_environment, connector_vllm

pytestmark = [pytest.mark.vllm]
SAVED_S = 120.0  # the connector uploads saves on its own thread, after the step


def text_prompt(seed: str, words: int = 300) -> str:
    return " ".join(f"{seed}{i % 89} engine" for i in range(words))


def send(server: ConnectorVllm, prompt: str) -> tuple[int, int]:
    """The prompt sent as text (tokenized as fleet where tokenizes it): prompt and cached
    tokens as vLLM reports them."""
    reply = httpx.post(
        f"{server.root_url}/v1/completions",
        json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0},
        timeout=300.0,
    )
    reply.raise_for_status()
    usage = reply.json()["usage"]
    details = usage.get("prompt_tokens_details") or {}
    return int(usage["prompt_tokens"]), int(details.get("cached_tokens") or 0)


async def where(server: ConnectorVllm, settings: Settings, prompt: str) -> InstanceWhere:
    status = server.managed.status()
    assert status.base_url is not None, status
    member = FleetInstance(
        name="a",
        base_url=status.base_url,
        kv_events=status.kv_events,
        kv_events_replay=status.kv_events_replay,
    )
    conn = FleetConnection(Fleet(instances=(member,)))
    try:
        out = await where_cached(conn, prompt=prompt, tiers=TierSources(settings))
    finally:
        await conn.aclose()
    return out.instances[0]


def engine_reads(engine: RunningEngine) -> tuple[int, int]:
    with engine.sync_client() as kv:
        stats = kv.engine_stats()
    assert isinstance(stats, EngineStats), stats
    return stats.get_hits or 0, stats.get_misses or 0


async def test_the_engine_tier_predicts_what_a_restarted_vllm_loads(
    durable_engine: RunningEngine, tmp_path: Path
) -> None:
    data_dir = tmp_path / "stack"
    settings = durable_engine.settings.model_copy(update={"data_dir": data_dir})
    with connector_vllm(data_dir, durable_engine, kv_events=True) as server:
        published = server.managed.home / IDENTITY_FILE_NAME
        record = json.loads(published.read_text())
        assert stat.S_IMODE(published.stat().st_mode) == 0o600
        assert record["identity_digest"] == server.identity_digest()
        assert (record["block_size"], record["key_scheme"]) == (32, KEY_SCHEME_VERSION)
        assert record["state_identity_digest"] is None

        never = text_prompt("never")
        before = engine_reads(durable_engine)
        cold = await where(server, settings, never)
        assert engine_reads(durable_engine) == before  # HEAD reads no value
        assert cold.tiers["l2"].tokens == 0 and cold.tiers["l2"].trusted
        assert cold.tiers["l2"].source == ENGINE_BLOCKS_SOURCE
        assert cold.cached_tokens == 0

        prompt = text_prompt("sent")
        prompt_tokens, first_cached = send(server, prompt)
        assert first_cached == 0
        full = prompt_tokens // 32 * 32
        loads = (prompt_tokens - 1) // 32 * 32
        with anyio.fail_after(SAVED_S):
            while True:
                if (await where(server, settings, prompt)).tiers["l2"].tokens == full:
                    break
                await anyio.sleep(0.5)

        with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache_root:
            env = connector_environment(durable_engine.settings, Path(cache_root))
            server.managed.restart(env=env, ready_timeout_s=READY_TIMEOUT_S)
        assert json.loads(published.read_text())["identity_digest"] == record["identity_digest"]

        predicted = await where(server, settings, prompt)
        assert predicted.tiers["vllm"].tokens == 0 and predicted.trusted
        assert predicted.tiers["l2"].tokens == full and predicted.tiers["l2"].trusted
        assert predicted.cached_tokens == loads > 0
        never_after = await where(server, settings, never)
        assert never_after.tiers["l2"].tokens == 0 and never_after.cached_tokens == 0

        hits, misses = engine_reads(durable_engine)
        external = server.external_hits()
        again_tokens, again_cached = send(server, prompt)
        assert again_tokens == prompt_tokens
        assert again_cached == predicted.cached_tokens
        assert server.external_hits() - external == loads
        hits2, misses2 = engine_reads(durable_engine)
        assert (hits2 - hits, misses2 - misses) == (loads // 32, 0)
