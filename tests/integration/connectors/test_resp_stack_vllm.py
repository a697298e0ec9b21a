"""The restart proof on the `redis_resp` path, and the two L2 paths side by side: real CPU vLLM
with LMCache's MP connector, real `lmcache server`, real engine with its RESP wire.

Cold on a resp server -> vLLM and server restarted -> the prompt comes back from L2 through the
engine's RESP wire with the cold run's logprobs, while the engine's `/kv/stats` does not move (the
RESP keyspace is separate from `/kv`). Then the same engine behind our native adapter: the same
prompt is cold there (the keyspaces do not meet) and `/kv/stats` moves as it is stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.files.hf_config import read_hf_config
from graph_kvcache_mcp.domain.lmcache.model import facts_from_hf_config
from tests.support.engines import RunningEngine, running_engine
from tests.support.lmcache import engine_stats
from tests.support.mp_stack import CHUNK_TOKENS, mp_vllm, native_server, resp_server
from tests.support.processes import wait_until
from tests.support.vllm import tiny_model_dir
from tests.support.vllm_connector import random_prompt

pytestmark = [pytest.mark.vllm, pytest.mark.lmcache]

PROMPT_TOKENS = 1300
L2_HIT = "lmcache_mp_lookup_hit_l2_tokens_total"
L2_STORED = "lmcache_mp_l2_store_completed_objects_chunks_total"


@pytest.fixture(scope="module")
def resp_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    with running_engine(tmp_path_factory.mktemp("engine-resp"), "durable", resp=True) as engine:
        yield engine


def test_redis_resp_survives_a_server_and_vllm_restart_and_leaves_kv_stats_alone_unlike_native(
    resp_engine: RunningEngine, tmp_path: Path
) -> None:
    model_dir = tiny_model_dir()
    facts = facts_from_hf_config(read_hf_config(model_dir), name="tiny-llama")
    prompt = random_prompt(PROMPT_TOKENS, seed=18_003)
    whole_chunks = PROMPT_TOKENS // CHUNK_TOKENS * CHUNK_TOKENS
    before = engine_stats(resp_engine)

    with resp_server(tmp_path / "lmc", resp_engine, facts) as server:
        with mp_vllm(tmp_path / "v1", server, kv_connector="redis_resp") as vllm:
            cold = vllm.complete(prompt)
        assert cold.cached_tokens == 0
        server.wait_counter(L2_STORED, at_least=PROMPT_TOKENS // CHUNK_TOKENS)

    with resp_server(tmp_path / "lmc", resp_engine, facts) as server:  # a new, empty L1
        assert server.status.report is not None and server.status.report.l1_objects == 0
        with mp_vllm(tmp_path / "v1", server, kv_connector="redis_resp") as vllm:
            warm = vllm.complete(prompt)
        hit_l2 = server.counter(L2_HIT)
    assert warm.cached_tokens >= whole_chunks - CHUNK_TOKENS, warm
    assert hit_l2 >= warm.cached_tokens
    assert warm.logprobs == cold.logprobs
    after_resp = engine_stats(resp_engine)
    assert after_resp == before, "RESP stores must not show in /kv/stats"

    with native_server(tmp_path / "lmc", resp_engine, facts) as server:
        with mp_vllm(tmp_path / "v1", server, kv_connector="mp_native") as vllm:
            native = vllm.complete(prompt)
        server.wait_counter(L2_STORED, at_least=PROMPT_TOKENS // CHUNK_TOKENS)
    assert native.cached_tokens == 0, "the RESP keyspace is not the /kv one"
    assert native.logprobs == cold.logprobs
    wait_until(
        lambda: (engine_stats(resp_engine).put_new or 0) > (before.put_new or 0),
        timeout_s=60,
        what="the native adapter's stores in /kv/stats",
    )
    moved = engine_stats(resp_engine)
    assert (moved.put_new or 0) - (before.put_new or 0) >= PROMPT_TOKENS // CHUNK_TOKENS
