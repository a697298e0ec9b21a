"""The LMCache MP stack rules on reported facts: each finding, its edge, and its fix."""

from __future__ import annotations

from graph_kvcache_mcp.domain.diagnosis.stack_findings import (
    EngineFacts,
    Finding,
    LmcacheFacts,
    VllmFacts,
    stack_findings,
)
from graph_kvcache_mcp.domain.vllm.metrics import CacheConfig

ENGINE = EngineFacts(target="http://127.0.0.1:9130", source="managed", reachable=True)
VLLM = VllmFacts(
    target="http://127.0.0.1:8000/v1",
    reachable=True,
    cache_config=CacheConfig(block_size=32, enable_prefix_caching=True),
    prompt_tokens_details=True,
    kv_connector="LMCacheMPConnector",
    hash_seed="0",
    platform="cpu",
    lmcache_target="127.0.0.1:5555",
    lmcache_target_answers=True,
)
LMCACHE = LmcacheFacts(
    target="http://127.0.0.1:8080",
    reachable=True,
    hash_seed="0",
    chunk_size=64,
    l2_adapters=1,
    transfer_mode="auto",
    rpc_port=5555,
)


def found(vllm: VllmFacts = VLLM, lmcache: LmcacheFacts = LMCACHE) -> dict[str, Finding]:
    return {f.id: f for f in stack_findings(ENGINE, vllm, lmcache).findings}


def test_a_well_set_up_cpu_stack_has_no_finding() -> None:
    assert set(found()) == set()


def test_the_default_lmcache_driven_server_under_a_cpu_vllm_is_the_registration_hang() -> None:
    hang = found(lmcache=LMCACHE.model_copy(update={"transfer_mode": "lmcache_driven"}))
    finding = hang["lmcache_transfer_mode_mismatch"]
    assert finding.severity == "error" and "--supported-transfer-mode auto" in finding.fix
    on_gpu = VLLM.model_copy(update={"platform": "gpu"})
    gpu = found(on_gpu, LMCACHE.model_copy(update={"transfer_mode": "lmcache_driven"}))
    assert "lmcache_transfer_mode_mismatch" not in gpu


def test_the_servers_own_log_line_proves_the_hang_whatever_the_flags_say() -> None:
    line = "No handler registered for operation register_kv_cache_engine_driven_context"
    out = found(
        vllm=VLLM.model_copy(update={"platform": None}),
        lmcache=LMCACHE.model_copy(update={"registration_hang": line}),
    )
    assert out["lmcache_transfer_mode_mismatch"].evidence == line


def test_lmcache_driven_on_a_cpu_vllm_or_its_leftover_segments_are_the_leak() -> None:
    forced = found(vllm=VLLM.model_copy(update={"lmcache_transfer_mode": "lmcache_driven"}))
    assert forced["lmcache_driven_leaks_shm"].severity == "warning"
    leftover = found(lmcache=LMCACHE.model_copy(update={"leaked_segments": ["lmcache_kv_42_0"]}))
    assert "lmcache_kv_42_0" in leftover["lmcache_driven_leaks_shm"].evidence
    assert "lmcache_driven_leaks_shm" not in found(
        vllm=VLLM.model_copy(update={"lmcache_transfer_mode": "auto"})
    )


def test_a_chunk_that_is_not_a_block_multiple_names_the_two_nearest_that_are() -> None:
    out = found(lmcache=LMCACHE.model_copy(update={"chunk_size": 80}))
    finding = out["lmcache_chunk_not_block_multiple"]
    assert finding.severity == "error" and "--chunk-size 64 or 96" in finding.fix


def test_a_chunk_longer_than_the_shared_prefix_caches_nothing() -> None:
    short = found(vllm=VLLM.model_copy(update={"shared_prefix_tokens": 48}))
    assert short["lmcache_chunk_larger_than_prompts"].severity == "warning"
    assert "lmcache_chunk_larger_than_prompts" not in found(
        vllm=VLLM.model_copy(update={"shared_prefix_tokens": 64})
    )


def test_a_server_without_l2_or_whose_resp_engine_is_gone_is_flagged() -> None:
    bare = found(lmcache=LMCACHE.model_copy(update={"l2_adapters": 0}))
    assert bare["lmcache_l2_not_configured"].severity == "warning"
    assert "lmcache_l2_not_configured" not in found(
        lmcache=LMCACHE.model_copy(update={"l2_adapters": None})
    )
    gone = found(lmcache=LMCACHE.model_copy(update={"resp_peer_gone": "engine pid 7 is gone"}))
    finding = gone["lmcache_resp_engine_restarted"]
    assert finding.severity == "error" and "restart the lmcache server" in finding.fix


def test_a_server_vllm_cannot_reach_is_an_error_whether_nothing_or_another_port_listens() -> None:
    silent = found(vllm=VLLM.model_copy(update={"lmcache_target_answers": False}))
    assert "nothing listens" in silent["lmcache_unreachable_from_vllm"].evidence
    moved = found(lmcache=LMCACHE.model_copy(update={"rpc_port": 5600}))
    assert "port 5600" in moved["lmcache_unreachable_from_vllm"].evidence


def test_mp_rules_need_the_mp_connector_and_differing_seeds_still_count() -> None:
    engine_connector = VLLM.model_copy(
        update={"kv_connector": "EngineKVConnector", "lmcache_target_answers": False}
    )
    assert "lmcache_unreachable_from_vllm" not in found(vllm=engine_connector)
    seeds = found(lmcache=LMCACHE.model_copy(update={"hash_seed": "1"}))
    assert "hash_seed_mismatch" in seeds
