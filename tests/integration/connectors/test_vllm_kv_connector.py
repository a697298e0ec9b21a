"""EngineKVConnector in real CPU vLLM processes, on a real engine.

vLLM starts are slow here (30-150 s), so the module shares them: `first` (bfloat16) and
`float32` (another KV dtype: another model identity). Each test sets up what it needs and leaves
the shared processes as it found them, so the tests pass in any order: the restart test restarts
`first` in place (same port), the engine-stop test starts the engine again on its port.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.domain.bundle import ChatMessage
from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats
from graph_kvcache_mcp.domain.outcomes import Presence
from graph_kvcache_mcp.domain.vllm.chat import ChatResult
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.vllm.restart_reuse import RestartReuseOut
from tests.support.engines import RunningEngine, running_engine
from tests.support.processes import wait_until
from tests.support.vllm import READY_TIMEOUT_S, require_vllm_venv
from tests.support.vllm_connector import (
    ConnectorVllm,
    connector_environment,
    connector_vllm,
    random_prompt,
)

pytestmark = pytest.mark.vllm

PROMPT_TOKENS = 300  # 9 full blocks of 32 and a partial one
FULL_BLOCK_TOKENS = 9 * 32


@pytest.fixture(scope="module")
def kv_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    with running_engine(tmp_path_factory.mktemp("connector-engine"), "memory") as engine:
        yield engine


@pytest.fixture(scope="module")
def first(
    kv_engine: RunningEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConnectorVllm]:
    with connector_vllm(tmp_path_factory.mktemp("vllm-first"), kv_engine) as server:
        yield server


@pytest.fixture(scope="module")
def float32(
    kv_engine: RunningEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConnectorVllm]:
    with connector_vllm(
        tmp_path_factory.mktemp("vllm-float32"), kv_engine, dtype="float32"
    ) as server:
        yield server


def _wait_stored(engine: RunningEngine, keys: list[str]) -> None:
    """Saves are uploaded in the background after the step that filled the blocks."""
    with engine.sync_client() as client:
        wait_until(
            lambda: all(p == Presence(True) for p in client.contains_many(keys)),
            timeout_s=30.0,
            what=f"{len(keys)} blocks in the engine",
        )


def test_a_second_vllm_beside_the_first_loads_what_the_first_computed(
    first: ConnectorVllm, kv_engine: RunningEngine, tmp_path: Path
) -> None:
    prompt = random_prompt(PROMPT_TOKENS, seed=11)
    cold = first.complete(prompt)
    _wait_stored(kv_engine, first.keys_of(prompt))
    with connector_vllm(tmp_path, kv_engine) as second:
        hits_before, by_source_before = second.external_hits(), second.cached_by_source()
        warm = second.complete(prompt)
        hits = second.external_hits() - hits_before
        by_source = second.cached_by_source()
    assert cold.cached_tokens == 0
    assert (warm.cached_tokens, hits) == (FULL_BLOCK_TOKENS, FULL_BLOCK_TOKENS)
    assert warm.text == cold.text
    # The connector names the tier (a memory engine on loopback: host memory), so vLLM counts
    # the engine's hits under it rather than external_unspecified.
    assert by_source.get("host", 0) - by_source_before.get("host", 0) == FULL_BLOCK_TOKENS
    unspecified = by_source.get("external_unspecified", 0)
    assert unspecified == by_source_before.get("external_unspecified", 0)


def test_a_corrupted_block_in_the_engine_is_recomputed_not_loaded(
    first: ConnectorVllm, kv_engine: RunningEngine
) -> None:
    prompt = random_prompt(PROMPT_TOKENS, seed=12)
    keys = first.keys_of(prompt)
    with kv_engine.sync_client() as client:
        client.put(keys[3], b"GKVB\x01garbage that only looks like a block")  # first writer wins
    cold = first.complete(prompt)
    _wait_stored(kv_engine, keys)
    first.reset_local_cache()
    warm = first.complete(prompt)
    assert warm.text == cold.text
    assert f"block {keys[3]} of request" in first.log_text()


def test_a_restarted_vllm_gets_the_prompt_blocks_from_the_engine(
    first: ConnectorVllm, kv_engine: RunningEngine, tmp_path: Path
) -> None:
    prompt = random_prompt(PROMPT_TOKENS, seed=13)
    cold = first.complete(prompt)
    _wait_stored(kv_engine, first.keys_of(prompt))
    pid_before = first.managed.running_state()
    first.managed.restart(
        env=connector_environment(kv_engine.settings, tmp_path / "cache"),
        ready_timeout_s=READY_TIMEOUT_S,
    )
    pid_after = first.managed.running_state()
    assert pid_before is not None and pid_after is not None
    assert pid_after.process.pid != pid_before.process.pid  # a new process, same port
    hits_before = first.external_hits()
    warm = first.complete(prompt)
    hits = first.external_hits() - hits_before
    assert (warm.cached_tokens, hits) == (FULL_BLOCK_TOKENS, FULL_BLOCK_TOKENS)
    assert warm.text == cold.text


async def test_vllm_restart_reuse_reports_the_restarted_call_served_from_the_engine(
    kv_engine: RunningEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with connector_vllm(tmp_path, kv_engine) as server:
        # The restart inherits this process's environment plus the engine's: put this checkout
        # and the test's offline settings there, as connector_vllm did for the first start.
        for name, value in connector_environment(kv_engine.settings, tmp_path / "cache").items():
            monkeypatch.setenv(name, value)
        settings = Settings.build(
            kv_url=kv_engine.base_url,
            kv_token=kv_engine.token,
            data_dir=tmp_path,
            vllm_base_url=f"{server.root_url}/v1",
            vllm_python=require_vllm_venv(),
        )
        async with Client(build_server(settings)) as client:
            result = await client.call_tool("vllm_restart_reuse", {"prompt_tokens": 400})
    assert not result.is_error, result.content
    out = RestartReuseOut.model_validate(result.structured_content)
    whole_blocks = (out.prompt_tokens - 1) // 32 * 32
    assert out.cold.cached_tokens == 0
    assert out.restarted.cached_tokens == out.restarted.external_hit_tokens == whole_blocks
    assert out.engine_blocks_stored is not None and out.engine_blocks_stored >= whole_blocks // 32
    # Measured by the connector's own counter in vLLM's /metrics, around the restarted call.
    assert out.engine_bytes_loaded == out.restarted.engine_bytes_read
    assert out.engine_bytes_loaded is not None
    assert _kv_bytes(whole_blocks) <= out.engine_bytes_loaded <= _kv_bytes(whole_blocks) * 1.05
    assert out.cold.engine_bytes_read == 0


def _kv_bytes(tokens: int) -> int:
    """The tiny model's KV for `tokens`: layers x K,V x heads x head size x 2 bytes (bf16)."""
    return tokens * 2 * 2 * 2 * 64 * 2


async def test_traces_from_metrics_count_engine_loads_as_external_hits(
    kv_engine: RunningEngine, tmp_path: Path
) -> None:
    """Without prompt-token details the hit comes from /metrics, whose prefix-cache counter
    misses a connector's loads: the trace adds the external counter's move and names it."""
    rules = f"Run {uuid.uuid4().hex}. " + " ".join(f"Rule {i}: keep it." for i in range(80))
    messages = [
        ChatMessage(role="system", content=rules),
        ChatMessage(role="user", content="hello"),
    ]
    with connector_vllm(tmp_path, kv_engine, prompt_tokens_details=False) as server:
        async with VllmClient(f"{server.root_url}/v1") as client:
            with kv_engine.sync_client() as kv:
                stored_before = _stored_blocks(kv)
                cold = await client.chat(messages, max_tokens=1)
                assert isinstance(cold, ChatResult)
                whole = (cold.trace.prompt_tokens - 1) // 32 * 32
                wait_until(
                    lambda: _stored_blocks(kv) >= stored_before + whole // 32,
                    timeout_s=30.0,
                    what="the cold call's blocks in the engine",
                )
            server.reset_local_cache()
            warm = await client.chat(messages, max_tokens=1)
    assert isinstance(warm, ChatResult)
    assert cold.trace.cached_tokens_source == warm.trace.cached_tokens_source == "metrics_delta"
    assert (cold.trace.prefix_cache_hit_tokens, cold.trace.external_cache_hit_tokens) == (0, 0)
    assert warm.trace.prefix_cache_hit_tokens == warm.trace.external_cache_hit_tokens == whole
    assert warm.trace.local_cache_hit_tokens == 0
    assert warm.trace.external_bytes_read is not None
    assert _kv_bytes(whole) <= warm.trace.external_bytes_read <= _kv_bytes(whole) * 1.05


def _stored_blocks(kv: SyncKvClient) -> int:
    stats = kv.engine_stats()
    assert isinstance(stats, EngineStats) and stats.unique_blocks is not None, stats
    return stats.unique_blocks


def test_another_kv_dtype_is_a_miss_for_blocks_stored_by_the_first_model(
    first: ConnectorVllm, float32: ConnectorVllm, kv_engine: RunningEngine
) -> None:
    prompt = random_prompt(PROMPT_TOKENS, seed=16)
    first.complete(prompt)  # stored by the bfloat16 server, so a miss below means something
    _wait_stored(kv_engine, first.keys_of(prompt))
    hits_before = float32.external_hits()
    answer = float32.complete(prompt)
    assert (answer.cached_tokens, float32.external_hits() - hits_before) == (0, 0)


def test_the_engine_stopped_mid_run_costs_recompute_not_errors(
    float32: ConnectorVllm, kv_engine: RunningEngine
) -> None:
    prompt = random_prompt(PROMPT_TOKENS, seed=14)
    float32.complete(prompt)
    _wait_stored(kv_engine, float32.keys_of(prompt))
    port = int(kv_engine.base_url.rsplit(":", 1)[1].split("/", 1)[0])
    kv_engine.managed.stop(term_wait_s=5.0)
    try:
        float32.reset_local_cache()
        again = float32.complete(prompt)
        fresh = float32.complete(random_prompt(PROMPT_TOKENS, seed=15))
    finally:  # the shared engine again, on its port and token, for the tests that follow
        kv_engine.managed.start(port=port, backend=kv_engine.backend)
    assert (again.cached_tokens, fresh.cached_tokens) == (0, 0)
    assert "engine KV lookup failed, treated as a miss" in float32.log_text()
