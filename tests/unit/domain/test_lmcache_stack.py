"""The MP stack's pure parts: the server planned from a vLLM launch, LMCache's own counters, and
the external hit split into LMCache L1 and L2 (null + note when the server saw other lookups)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_kvcache_mcp.domain.lmcache.config import LmcacheChoices, plan_lmcache
from graph_kvcache_mcp.domain.lmcache.metrics import (
    LmcacheCounters,
    counters_moved,
    parse_lmcache_counters,
)
from graph_kvcache_mcp.domain.lmcache.stack import (
    StackOptions,
    generic_facts,
    plan_stack_server,
    with_private_rpc,
)
from graph_kvcache_mcp.domain.vllm.chat import CachedTokens, split_lmcache_tiers
from graph_kvcache_mcp.domain.vllm.launch import Platform, VllmLaunch, plan_launch
from graph_kvcache_mcp.domain.vllm.traces import Trace, summarize
from graph_kvcache_mcp.domain.vllm.wiring import wiring_of
from graph_kvcache_mcp.errors import ConfigError

CPU = Platform(kind="cpu", detail="test")
GPU = Platform(kind="gpu", gpus=["H100"], detail="test")


def launch(**values: object) -> VllmLaunch:
    return VllmLaunch.model_validate(
        {"model": "/m", "port": 8100, "kv_connector": "mp_native", "lmcache_port": 6100, **values}
    )


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_on_cpu_the_server_takes_the_shared_memory_path_and_a_whole_number_of_blocks() -> None:
    plan = plan_stack_server(
        launch(block_size=64),
        generic_facts("/m"),
        CPU,
        engine_url="http://127.0.0.1:9130",
        options=StackOptions(http_port=6101, chunk_size=128),
    )
    assert plan.lmcache_server is not None
    argv = plan.lmcache_server.argv
    assert flag(argv, "--supported-transfer-mode") == "auto"
    assert flag(argv, "--shm-name") == "graphkv_6100"
    assert "--no-l1-use-lazy" in argv and "lmcache_driven" not in argv
    assert (flag(argv, "--port"), flag(argv, "--http-port")) == ("6100", "6101")
    assert flag(argv, "--host") == flag(argv, "--http-host") == "127.0.0.1"
    assert flag(argv, "--chunk-size") == "128"
    assert plan.lmcache_server.env["PYTHONHASHSEED"] == "0"
    assert plan.lmcache_server.env["LMCACHE_TRACK_USAGE"] == "false"
    assert plan.l2_adapter is not None and plan.l2_adapter["type"] == "native_plugin"
    # vLLM is planned with the same seed and the same server port
    vllm = plan_launch(launch(block_size=64), CPU, host="127.0.0.1")
    assert vllm.env["PYTHONHASHSEED"] == "0" and vllm.env["GLOO_SOCKET_IFNAME"] == "lo"
    assert wiring_of(vllm.args).lmcache_port == 6100


def test_a_chunk_that_is_not_a_whole_number_of_vllm_blocks_is_refused() -> None:
    with pytest.raises(ConfigError, match="multiple of vLLM's block size 64: use 64 or 128"):
        plan_stack_server(
            launch(block_size=64),
            generic_facts("/m"),
            CPU,
            engine_url="http://127.0.0.1:9130",
            options=StackOptions(chunk_size=96),
        )


def test_the_default_chunk_fits_the_cpu_block_and_a_gpu_keeps_lmcaches_transfer() -> None:
    cpu = plan_stack_server(
        launch(),
        generic_facts("/m"),
        CPU,
        engine_url="http://127.0.0.1:9130",
        options=StackOptions(),
    )
    gpu = plan_stack_server(
        launch(),
        generic_facts("/m"),
        GPU,
        engine_url="http://127.0.0.1:9130",
        options=StackOptions(),
    )
    assert cpu.lmcache_server is not None and gpu.lmcache_server is not None
    assert int(flag(cpu.lmcache_server.argv, "--chunk-size")) % 32 == 0
    assert "--supported-transfer-mode" not in gpu.lmcache_server.argv


def test_the_stack_is_for_mp_connectors_with_distinct_ports() -> None:
    facts = generic_facts("/m")
    with pytest.raises(ConfigError, match="runs no lmcache server"):
        plan_stack_server(
            launch(kv_connector="engine"),
            facts,
            CPU,
            engine_url="http://127.0.0.1:9",
            options=StackOptions(),
        )
    with pytest.raises(ConfigError, match="must all differ"):
        plan_stack_server(
            launch(),
            facts,
            CPU,
            engine_url="http://127.0.0.1:9",
            options=StackOptions(http_port=6100),
        )


EXPOSITION = """# HELP lmcache_mp_lookup_hit_l1_tokens_total x
# TYPE lmcache_mp_lookup_hit_l1_tokens_total counter
lmcache_mp_lookup_hit_l1_tokens_total{cache_salt="",model_name="a"} 256.0
lmcache_mp_lookup_hit_l1_tokens_total{cache_salt="s",model_name="b"} 64.0
# TYPE lmcache_mp_lookup_hit_l2_tokens_total counter
lmcache_mp_lookup_hit_l2_tokens_total{cache_salt="",model_name="a"} 512.0
# TYPE lmcache_mp_lookups_requests_total counter
lmcache_mp_lookups_requests_total{cache_salt="",model_name="a"} 3.0
# TYPE lmcache_mp_l2_store_completed_objects_chunks_total counter
lmcache_mp_l2_store_completed_objects_chunks_total 8.0
# TYPE lmcache_mp_l2_usage_bytes gauge
lmcache_mp_l2_usage_bytes{l2_name="native_plugin"} 524288.0
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1.0
"""


def test_the_servers_counters_are_summed_over_models_and_untouched_ones_are_zero() -> None:
    counters = parse_lmcache_counters(EXPOSITION)
    assert counters.l1_hit_tokens == 320 and counters.l2_hit_tokens == 512
    assert counters.lookups == 3 and counters.l2_stored_chunks == 8
    assert counters.l2_chunk_bytes == 65536
    assert counters.lookup_tokens == 0 and counters.l2_loaded_chunks == 0  # not counted yet
    assert parse_lmcache_counters("vllm:prompt_tokens_total 3\n").lookups is None
    restarted = LmcacheCounters(lookups=1, l1_hit_tokens=0, l2_hit_tokens=64)
    moved = counters_moved(counters, restarted)
    assert moved.lookups is None and moved.l1_hit_tokens is None  # went back: not a move


def external(tokens: int) -> CachedTokens:
    return CachedTokens(hit_tokens=tokens + 32, source="usage", external_tokens=tokens)


def test_one_lookup_splits_the_external_hit_into_l1_and_l2() -> None:
    moved = LmcacheCounters(lookups=1, l1_hit_tokens=256, l2_hit_tokens=512)
    split = split_lmcache_tiers(external(768), moved)
    assert (split.l1_tokens, split.l2_tokens, split.note) == (256, 512, None)


def test_other_lookups_on_a_shared_server_leave_the_split_unknown_and_say_why() -> None:
    moved = LmcacheCounters(lookups=2, l1_hit_tokens=256, l2_hit_tokens=0)
    split = split_lmcache_tiers(external(256), moved)
    assert split.l1_tokens is None and split.l2_tokens is None
    assert split.note is not None and "2 lookups" in split.note
    assert split.external_tokens == 256  # what vLLM measured stays


def test_no_lookup_and_no_external_hit_is_a_known_zero() -> None:
    moved = LmcacheCounters(lookups=0, l1_hit_tokens=0, l2_hit_tokens=0)
    split = split_lmcache_tiers(external(0), moved)
    assert (split.l1_tokens, split.l2_tokens) == (0, 0)


def test_the_summary_adds_lmcache_tiers_over_the_calls_that_measured_them() -> None:
    def call(l1: int | None, l2: int | None) -> Trace:
        return Trace(
            model="m",
            prompt_tokens=1000,
            completion_tokens=1,
            prefix_cache_hit_tokens=800,
            external_cache_hit_tokens=768,
            lmcache_l1_hit_tokens=l1,
            lmcache_l2_hit_tokens=l2,
            cached_tokens_source="usage",
            latency_s=0.1,
        )

    summary = summarize([call(256, 512), call(None, None), call(0, 768)])
    assert summary.tokens_saved_by_tier == {
        "local": 96,
        "external": 2304,
        "lmcache_l1": 256,
        "lmcache_l2": 1280,
    }


def test_the_printed_vllm_command_targets_the_managed_servers_private_socket() -> None:
    plan = plan_lmcache(generic_facts("m"), LmcacheChoices(lmcache_port=6100))
    private = with_private_rpc(plan, Path("/d"))
    config = json.loads(flag(private.vllm.argv, "--kv-transfer-config"))
    urls = config["kv_connector_extra_config"]["lmcache.mp.server_urls"]
    assert urls == ["ipc:///d/lmcache/rpc-6100.sock"] and private.kv_transfer_config == config
    assert "rpc-6100.sock" in private.notes[-1]
    assert "server_urls" not in flag(plan.vllm.argv, "--kv-transfer-config")  # TCP before
    too_long = with_private_rpc(plan, Path("/" + "d" * 100))
    assert too_long.vllm == plan.vllm and "too long" in too_long.warnings[-1]
    inprocess = plan_lmcache(generic_facts("m"), LmcacheChoices(mode="inprocess_plugin"))
    assert with_private_rpc(inprocess, Path("/d")) == inprocess
