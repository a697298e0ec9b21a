"""vLLM -> lmcache server -> engine as one stack on CPU, every process real, across restarts.

One module-scoped stack (engine, `lmcache server` with our native_plugin L2, CPU vLLM with
LMCache's MP connector) serves the steps; each step first brings up whatever is not running
(`MpStack.ensure`), so none depends on the order of the file. Figures the tools report are
checked against vLLM's and LMCache's own /metrics, scraped here. vLLM starts: 1 (stack) + 1 (vLLM
restart) + 1 (stack restart) + 1 (second instance) = 4. The memory-pressure step needs none: the
stack's vLLM has only 8 MiB of KV memory.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from mcp import Client

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStopResult
from graph_kvcache_mcp.connectors.processes.identity import environment_value
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.domain.lmcache.stack import rpc_socket_path
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.kv.views import KvStatsOut
from graph_kvcache_mcp.services.vllm.restart_reuse import RestartReuseOut
from graph_kvcache_mcp.services.vllm.views import VllmStatusOut
from tests.support.mcp_calls import call_error, call_ok
from tests.support.mp_stack import (
    CHUNK_SIZE,
    KV_BYTES_PER_TOKEN,
    KV_TOKENS,
    MpStack,
    cached_tokens_of,
    logprobs_of,
    module_stack,
    shm_entries,
)
from tests.support.vllm import READY_TIMEOUT_S, VLLM_CPU, VLLM_PYTHON, tiny_model_dir
from tests.support.vllm_connector import random_prompt

pytestmark = [pytest.mark.vllm, pytest.mark.lmcache]


@pytest.fixture(scope="module")
def stack_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MpStack]:
    yield from module_stack(tmp_path_factory.mktemp("mp-stack"))


@pytest.fixture
async def stack(stack_root: MpStack) -> AsyncIterator[MpStack]:
    await stack_root.ensure()
    yield stack_root


async def test_one_call_brings_the_stack_up_and_a_second_reuses_it(stack: MpStack) -> None:
    state = stack.lmcache.running_state()
    vllm_state = stack.vllm.running_state()
    assert state is not None and vllm_state is not None
    command = " ".join(state.process.command)
    assert "--supported-transfer-mode auto" in command and f"--shm-name {stack.shm_name}" in command
    assert f"--chunk-size {CHUNK_SIZE}" in command and "--host 127.0.0.1" in command
    assert "lmcache_driven" not in command
    # vLLM and the server hash prompts with the same seed, or no lookup ever hits
    seed = environment_value(vllm_state.process.pid, "PYTHONHASHSEED")
    assert seed == environment_value(state.process.pid, "PYTHONHASHSEED") == "0"
    assert environment_value(state.process.pid, "LMCACHE_TRACK_USAGE") == "false"
    assert shm_entries(stack.shm_name, []) == [f"lmcache_l1_pool_{stack.shm_name}"]

    arguments = {
        "model": str(tiny_model_dir()),
        "served_model_name": "tiny-llama",
        "port": stack.vllm_port,
        "max_model_len": 4096,
        "dtype": "bfloat16",
        "block_size": 32,
        "kv_cache_memory_bytes": stack.launch().kv_cache_memory_bytes,
        "dev_mode": True,
        "kv_connector": "mp_native",
    }
    async with Client(build_server(stack.settings)) as client:
        out = VllmStatusOut.model_validate(await call_ok(client, "vllm_start", arguments))
    elsewhere = stack.settings.model_copy(update={"lmcache_port": free_port()})
    async with Client(build_server(elsewhere)) as client:
        other_port = await call_error(client, "vllm_start", arguments)
    assert out.reused and out.pid == vllm_state.process.pid
    assert out.lmcache is not None and out.lmcache.reused and out.lmcache.healthy
    assert out.lmcache.pid == state.process.pid
    assert out.l2_engine_url == stack.engine_url
    assert out.lmcache.report is not None and out.lmcache.report.chunk_size == CHUNK_SIZE
    assert [a.healthy for a in out.lmcache.report.l2_adapters] == [True]
    assert "already runs" in other_port and str(stack.lmcache_port) in other_port
    # the session's exit (its lmcache lease dropped) left the server under the running vLLM
    assert stack.lmcache.running_state() is not None


async def test_a_vllm_restart_is_served_from_the_servers_l1(stack: MpStack) -> None:
    server_before = stack.lmcache_counters()
    async with Client(build_server(stack.settings)) as client:
        raw = await call_ok(
            client,
            "vllm_restart_reuse",
            {"prompt_tokens": 1024, "ready_timeout_s": READY_TIMEOUT_S},
        )
    out = RestartReuseOut.model_validate(raw)
    server_after = stack.lmcache_counters()
    vllm_after = stack.vllm_counters()  # the restarted vLLM: only the measured call ran on it
    assert out.kv_connector == "LMCacheMPConnector" and out.restarted_processes == ["vllm"]
    assert out.cold.cached_tokens == 0 and out.cold.external_hit_tokens == 0
    whole_chunks = out.prompt_tokens // CHUNK_SIZE * CHUNK_SIZE
    assert out.restarted.external_hit_tokens is not None
    assert whole_chunks - CHUNK_SIZE <= out.restarted.external_hit_tokens <= whole_chunks
    assert out.restarted.external_hit_tokens == vllm_after.external_prefix_cache_hits_tokens
    assert out.restarted.lmcache_l1_hit_tokens == out.restarted.external_hit_tokens, out.restarted
    assert out.restarted.lmcache_l2_hit_tokens == 0
    assert server_before.l1_hit_tokens is not None and server_after.l1_hit_tokens is not None
    assert server_after.l1_hit_tokens - server_before.l1_hit_tokens == (
        out.restarted.lmcache_l1_hit_tokens
    )
    assert out.ttft_speedup is not None, out


async def test_a_server_and_vllm_restart_is_served_from_the_engine(stack: MpStack) -> None:
    async with Client(build_server(stack.settings)) as client:
        raw = await call_ok(
            client,
            "vllm_restart_reuse",
            {"prompt_tokens": 1024, "restart": "stack", "ready_timeout_s": READY_TIMEOUT_S},
        )
        stats = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
    out = RestartReuseOut.model_validate(raw)
    server = stack.lmcache_counters()  # the new server: only the measured call looked it up
    assert stats.lmcache is not None and stats.lmcache.l2_hit_tokens == server.l2_hit_tokens
    assert stats.lmcache.l2_loaded_chunks == server.l2_loaded_chunks
    assert out.restarted_processes == ["vllm", "lmcache server"]
    assert out.engine_blocks_stored is not None and out.engine_blocks_stored > 0
    hit = out.restarted.external_hit_tokens
    assert hit is not None and hit >= out.prompt_tokens // CHUNK_SIZE * CHUNK_SIZE - CHUNK_SIZE
    assert out.restarted.lmcache_l2_hit_tokens == hit == server.l2_hit_tokens
    assert out.restarted.lmcache_l1_hit_tokens == 0 == server.l1_hit_tokens
    assert out.restarted.engine_blocks_read == hit // CHUNK_SIZE
    # the tiny model's KV is 1 KiB per token (2 layers x K,V x 2 heads x 64 x bf16)
    assert out.engine_bytes_loaded == hit * KV_BYTES_PER_TOKEN
    assert server.l2_loaded_chunks == hit // CHUNK_SIZE


async def test_a_second_vllm_beside_the_first_gets_its_kv_and_the_same_logprobs(
    stack: MpStack, tmp_path: Path
) -> None:
    prompt = random_prompt(700, seed=18)
    changed = [prompt[0] + 1, *prompt[1:]]
    first = stack.complete(prompt)
    assert cached_tokens_of(first) == 0
    other = stack.complete(changed)
    # the random model's answer depends on the prompt's first token (checked here), so equal
    # logprobs below mean restored KV, not a model that ignores its context
    assert logprobs_of(other) != logprobs_of(first)
    second = ManagedVllm(tmp_path / "second", python=VLLM_PYTHON)
    try:
        port = free_port()
        # The server's KV RPC is a private unix socket in the stack's data dir (no TCP port a
        # neighbour could reach): a second vLLM of the same user is aimed at it by path.
        socket = rpc_socket_path(stack.data_dir, stack.lmcache_port)
        assert socket is not None and socket.is_socket()
        second.start(
            stack.launch(port=port).model_copy(update={"lmcache_rpc_url": f"ipc://{socket}"}),
            env=stack.env,
            ready_timeout_s=READY_TIMEOUT_S,
            platform=VLLM_CPU,
        )
        before = stack.lmcache_counters()
        again = stack.complete(prompt, port=port)
        after = stack.lmcache_counters()
        counted = stack.vllm_counters(port)
    finally:
        second.stop(term_wait_s=10.0)
    assert cached_tokens_of(again) == 700 // CHUNK_SIZE * CHUNK_SIZE
    assert counted.external_prefix_cache_hits_tokens == cached_tokens_of(again)
    assert after.l1_hit_tokens is not None and before.l1_hit_tokens is not None
    assert after.l1_hit_tokens - before.l1_hit_tokens == cached_tokens_of(again)
    assert logprobs_of(again) == logprobs_of(first)
    assert "Unregistered" in stack.lmcache_log()


async def test_a_prompt_evicted_from_vllms_kv_memory_comes_back_from_lmcache(
    stack: MpStack,
) -> None:
    first = random_prompt(1500, seed=1810)
    cold = stack.complete(first)
    assert cached_tokens_of(cold) == 0
    # more distinct long prompts than vLLM's own KV memory holds: its copy of `first` is evicted
    for seed in range(1811, 1811 + KV_TOKENS // 1500 + 1):
        stack.complete(random_prompt(1500, seed=seed))
    before = stack.vllm_counters()
    again = stack.complete(first)
    after = stack.vllm_counters()
    external = after.external_prefix_cache_hits_tokens
    assert external is not None and before.external_prefix_cache_hits_tokens is not None
    loaded = external - before.external_prefix_cache_hits_tokens
    assert cached_tokens_of(again) == 1500 // CHUNK_SIZE * CHUNK_SIZE
    assert loaded == cached_tokens_of(again), "the prefix was not served by LMCache"
    assert logprobs_of(again) == logprobs_of(cold)
    assert stack.healthy()


async def test_with_the_engine_stopped_vllm_recomputes_without_error(stack: MpStack) -> None:
    stack.engine.stop(term_wait_s=5.0)
    try:
        began = time.monotonic()
        answer = stack.complete(random_prompt(400, seed=1801))
        again = stack.complete(random_prompt(400, seed=1802))
        elapsed = time.monotonic() - began
    finally:
        stack.engine.start(backend="durable", port=stack.engine_port)
    assert answer["choices"][0]["text"] and again["choices"][0]["text"]
    assert elapsed < 150, f"two short calls took {elapsed:.0f} s with L2 down"


async def test_stopping_the_server_under_vllm_is_refused_unless_forced(
    stack: MpStack, capsys: pytest.CaptureFixture[str]
) -> None:
    server = stack.lmcache.running_state()
    vllm = stack.vllm.running_state()
    assert server is not None and vllm is not None
    cli_code = main(["lmcache", "stop", "--data-dir", str(stack.data_dir)])
    cli_refusal = capsys.readouterr().err
    async with Client(build_server(stack.settings)) as client:
        refused = await call_error(client, "lmcache_stop", {})
        assert stack.vllm.running_state() is not None  # nothing was stopped
        assert stack.complete(random_prompt(100, seed=1803))["choices"]
        forced = LmcacheStopResult.model_validate(
            await call_ok(client, "lmcache_stop", {"force": True})
        )
    assert f"pid {vllm.process.pid}" in refused and "force" in refused
    assert cli_code == 2 and f"pid {vllm.process.pid}" in cli_refusal and "--force" in cli_refusal
    assert forced.stopped and forced.pid == server.process.pid
    assert forced.also_stopped and str(vllm.process.pid) in forced.also_stopped[0]
    assert stack.vllm.running_state() is None
    assert ManagedLmcache(stack.data_dir).running_state() is None
    for pid in (vllm.process.pid, server.process.pid):
        assert _gone(pid), pid
    assert shm_entries(stack.shm_name, [vllm.process.pid]) == []


def _gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
