"""The stack rules on reported facts: each rule's edges, and the one finding a real component
cannot be made to show here (an unhealthy L2 adapter)."""

from __future__ import annotations

from graph_kvcache_mcp.domain.diagnosis.stack_findings import (
    EngineFacts,
    LmcacheFacts,
    VllmFacts,
    stack_findings,
)
from graph_kvcache_mcp.domain.targets import Configured, facts_not_readable_here
from graph_kvcache_mcp.domain.vllm.metrics import CacheConfig, count_preemptions

ENGINE = EngineFacts(target="http://127.0.0.1:9130", source="managed", reachable=True)
VLLM = VllmFacts(
    target="http://127.0.0.1:8000/v1",
    reachable=True,
    cache_config=CacheConfig(block_size=16, enable_prefix_caching=True),
    prompt_tokens_details=True,
    version="0.32.0",
)


def ids(
    engine: EngineFacts | None, vllm: VllmFacts | None, lmcache: LmcacheFacts | None
) -> set[str]:
    return {f.id for f in stack_findings(engine, vllm, lmcache).findings}


def test_healthy_facts_give_only_the_versions() -> None:
    assert ids(ENGINE, VLLM, None) == {"versions"}


def test_a_connector_that_is_queried_but_never_hits_is_flagged() -> None:
    never = VLLM.model_copy(update={"external_queries": 4096, "external_hits": 0})
    assert "external_cache_never_hits" in ids(ENGINE, never, None)
    some = VLLM.model_copy(update={"external_queries": 4096, "external_hits": 256})
    assert "external_cache_never_hits" not in ids(ENGINE, some, None)


def test_a_kv_cache_over_ninety_percent_full_is_pressure() -> None:
    assert "vllm_kv_pressure" in ids(ENGINE, VLLM.model_copy(update={"kv_cache_usage": 0.95}), None)
    assert "vllm_kv_pressure" not in ids(
        ENGINE, VLLM.model_copy(update={"kv_cache_usage": 0.5}), None
    )


def test_an_unset_or_different_hash_seed_matters_only_with_a_kv_connector() -> None:
    unset = VLLM.model_copy(update={"kv_connector": "LMCacheMPConnector", "hash_seed": None})
    assert "hash_seed_mismatch" in ids(ENGINE, unset, None)
    assert "hash_seed_mismatch" not in ids(ENGINE, VLLM, None)
    seeded = unset.model_copy(update={"hash_seed": "0"})
    assert "hash_seed_mismatch" not in ids(ENGINE, seeded, None)
    other = LmcacheFacts(target="http://127.0.0.1:8080", reachable=True, hash_seed="1")
    assert "hash_seed_mismatch" in ids(ENGINE, seeded, other)


def test_an_unhealthy_l2_adapter_is_an_error_naming_it() -> None:
    lmcache = LmcacheFacts(
        target="http://127.0.0.1:8080", reachable=True, unhealthy_l2=["native_plugin"]
    )
    out = stack_findings(ENGINE, VLLM, lmcache)
    finding = next(f for f in out.findings if f.id == "lmcache_l2_unhealthy")
    assert finding.severity == "error" and "native_plugin" in finding.evidence
    assert out.findings[0] is finding


def test_preemptions_are_summed_for_the_model_and_absent_is_none() -> None:
    text = (
        "# TYPE vllm:num_preemptions_total counter\n"
        'vllm:num_preemptions_total{engine="0",model_name="a"} 3.0\n'
        'vllm:num_preemptions_total{engine="1",model_name="a"} 2.0\n'
        'vllm:num_preemptions_total{engine="0",model_name="b"} 7.0\n'
    )
    assert count_preemptions(text, "a") == 5
    assert count_preemptions(text, None) == 12
    assert count_preemptions("# nothing\n", "a") is None


def test_what_a_component_not_started_here_hides_is_said_once_per_component() -> None:
    remote = Configured("vLLM", "https://gpu-box.example:8443/v1")
    hidden = facts_not_readable_here(remote, "PYTHONHASHSEED and log")
    vllm = VLLM.model_copy(update={"target": remote.url, "not_readable": hidden})
    server = LmcacheFacts(
        target="http://127.0.0.1:8080", reachable=True, not_readable="not managed here: x"
    )
    found = stack_findings(ENGINE, vllm, server).findings
    said = [(f.component, f.severity, f.evidence) for f in found if f.id == "runtime_not_readable"]
    assert said == [("vllm", "info", hidden), ("lmcache", "info", "not managed here: x")]
    assert hidden.startswith(f"not managed here: {remote.url} ")
    assert "read them on gpu-box.example, where it runs" in hidden
    unreachable = server.model_copy(update={"reachable": False})  # unreachable says enough
    assert "runtime_not_readable" not in ids(ENGINE, None, unreachable)
    assert "runtime_not_readable" not in ids(ENGINE, VLLM, None)  # the managed one: all read
