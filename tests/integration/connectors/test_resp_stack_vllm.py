"""The restart proof on the `redis_resp` path, and the two L2 paths side by side: real CPU vLLM
with LMCache's MP connector, real `lmcache server`, real engine with its RESP wire.

The stack comes up as `vllm start --kv-connector redis_resp` brings it up (`start_vllm`): the
managed engine with its RESP wire, the wire proven, the resp server, then vLLM. Cold -> vLLM and
server restarted (`restart_resp_lmcache` while vLLM is down) -> the prompt comes back from L2
through the RESP wire with the cold run's logprobs, while the engine's `/kv/stats` does not move
(the RESP keyspace is separate from `/kv`). Then the same engine behind our native adapter: the
same prompt is cold there (the keyspaces do not meet) and `/kv/stats` moves as it is stored.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import resolve_kv_target
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.files.hf_config import read_hf_config
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.stack.resp import restart_resp_lmcache
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.domain.lmcache.model import facts_from_hf_config
from graph_kvcache_mcp.domain.lmcache.stack import StackOptions
from graph_kvcache_mcp.services.lmcache.plan import server_environment
from graph_kvcache_mcp.services.stack.lifetime import RunsUntilStop
from graph_kvcache_mcp.services.stack.start import start_vllm
from graph_kvcache_mcp.services.vllm.views import VllmStatusOut
from tests.support.engines import RunningEngine
from tests.support.l2_paths import (
    CHUNK_TOKENS,
    MpVllm,
    StackServer,
    mp_vllm,
    native_server,
)
from tests.support.lmcache import engine_stats, require_lmcache
from tests.support.mp_stack import require_lmcache_in_vllm_venv
from tests.support.processes import wait_until
from tests.support.vllm import (
    READY_TIMEOUT_S,
    VLLM_CPU,
    fast_cpu_launch,
    offline_environment,
    tiny_model_dir,
)
from tests.support.vllm_connector import random_prompt

pytestmark = [pytest.mark.vllm, pytest.mark.lmcache]

PROMPT_TOKENS = 1300
L2_HIT = "lmcache_mp_lookup_hit_l2_tokens_total"
L2_STORED = "lmcache_mp_l2_store_completed_objects_chunks_total"


def test_redis_resp_survives_a_server_and_vllm_restart_and_leaves_kv_stats_alone_unlike_native(
    tmp_path: Path,
) -> None:
    data = tmp_path / "stack"
    vllm_python, lmcache_python = (
        require_lmcache_in_vllm_venv(),
        require_lmcache().with_name("python"),
    )
    settings = Settings.build(data_dir=data, vllm_python=vllm_python, lmcache_python=lmcache_python)
    engine = ManagedEngine(data)
    lmcache = ManagedLmcache(data, python=lmcache_python)
    vllm = ManagedVllm(data, python=vllm_python)
    launch = fast_cpu_launch(
        tiny_model_dir(), free_port(), kv_connector="redis_resp", lmcache_port=free_port()
    )
    prompt = random_prompt(PROMPT_TOKENS, seed=18_003)
    whole_chunks = PROMPT_TOKENS // CHUNK_TOKENS * CHUNK_TOKENS
    cache_root = Path(tempfile.mkdtemp(prefix="vllm-cache-", dir=tmp_path))
    vllm_env = {**offline_environment(cache_root), "GLOO_SOCKET_IFNAME": "lo"}

    async def start() -> VllmStatusOut:  # the engine (RESP wire) and server run until stop
        return await start_vllm(
            settings,
            launch,
            RunsUntilStop(),
            managed=vllm,
            options=StackOptions(http_port=free_port(), chunk_size=CHUNK_TOKENS, l1_size_gb=0.25),
            ready_timeout_s=READY_TIMEOUT_S,
            calls_base_url=settings.vllm_base_url,
            env=vllm_env,
            platform=VLLM_CPU,
        )

    first_part_passed = False
    try:
        out = anyio.run(start)
        assert out.lmcache is not None and out.lmcache.healthy
        state = lmcache.running_state()
        assert state is not None and state.resp_peer is not None
        assert '"type":"resp"' in " ".join(state.process.command)
        running = engine.running_state()
        assert running is not None
        token = engine.token()
        kv = RunningEngine(engine, running.base_url, token, "durable")
        before = engine_stats(kv)
        server = StackServer(lmcache, out.lmcache, launch.lmcache_port)
        served = MpVllm(vllm, vllm.status())
        cold = served.complete(prompt)
        assert cold.cached_tokens == 0
        server.wait_counter(L2_STORED, at_least=PROMPT_TOKENS // CHUNK_TOKENS)

        server_env = server_environment(state.plan_env, resolve_kv_target(settings))
        restarted: list[LmcacheStatus] = []

        def restart_server() -> None:  # while vLLM is down: the new server starts with empty L1
            restarted.append(restart_resp_lmcache(engine, lmcache, env=server_env))

        vllm.restart(env=vllm_env, ready_timeout_s=READY_TIMEOUT_S, while_stopped=restart_server)
        report = restarted[0].report
        assert report is not None and report.l1_objects == 0
        warm = MpVllm(vllm, vllm.status()).complete(prompt)
        hit_l2 = StackServer(lmcache, restarted[0], launch.lmcache_port).counter(L2_HIT)
        assert warm.cached_tokens >= whole_chunks - CHUNK_TOKENS, warm
        assert hit_l2 >= warm.cached_tokens
        assert warm.logprobs == cold.logprobs
        assert engine_stats(kv) == before, "RESP stores must not show in /kv/stats"
        first_part_passed = True
    finally:
        vllm.stop(term_wait_s=30.0)  # vLLM first: a worker whose server vanished waits on it
        lmcache.stop(term_wait_s=15.0)
        if not first_part_passed:  # the second part, which stops it, will not run
            engine.stop(term_wait_s=5.0)

    try:
        facts = facts_from_hf_config(read_hf_config(tiny_model_dir()), name="tiny-llama")
        with native_server(tmp_path / "native", kv, facts) as native_lmcache:
            with mp_vllm(tmp_path / "v2", native_lmcache, kv_connector="mp_native") as plain:
                native = plain.complete(prompt)
            native_lmcache.wait_counter(L2_STORED, at_least=PROMPT_TOKENS // CHUNK_TOKENS)
        assert native.cached_tokens == 0, "the RESP keyspace is not the /kv one"
        assert native.logprobs == cold.logprobs
        wait_until(
            lambda: (
                (engine_stats(kv).put_new or 0) - (before.put_new or 0)
                >= PROMPT_TOKENS // CHUNK_TOKENS
            ),
            timeout_s=60,
            what="the native adapter's stores in /kv/stats",
        )
    finally:
        engine.stop(term_wait_s=5.0)
