"""diagnose_stack on a hybrid, from the `vllm:cache_config_info` a real CPU vLLM 0.32 exported
while serving the tiny granite hybrid with vllm_start's recipe (block 128, align mode): the same
cache config is a crash when vLLM batches more than a block or the Mamba chunk is smaller."""

from __future__ import annotations

from pathlib import Path

from graph_kvcache_mcp.domain.diagnosis.stack_findings import VllmFacts, stack_findings
from graph_kvcache_mcp.domain.vllm.hybrid.launch import HybridRun, hybrid_run
from graph_kvcache_mcp.domain.vllm.metrics import parse_snapshot
from tests.unit.domain.test_hybrid_layout import tiny

EXPOSITION = Path(__file__).parents[2] / "data" / "vllm_metrics_hybrid_granite_cpu.prom"
RECIPE: tuple[str, ...] = ("--block-size", "128", "--mamba-cache-mode", "align")
RECIPE += ("--max-num-batched-tokens", "128", "--hf-overrides", '{"mamba_chunk_size":128}')


def findings(run: HybridRun | None, labels: dict[str, str] | None = None) -> dict[str, str]:
    config = parse_snapshot(EXPOSITION.read_text(), None).cache_config
    assert config is not None
    if labels:
        config = config.model_copy(update={"labels": {**config.labels, **labels}})
    facts = VllmFacts(
        target="http://127.0.0.1:8000/v1",
        reachable=True,
        cache_config=config,
        prompt_tokens_details=True,
        hybrid=run,
    )
    return {f.id: f.evidence for f in stack_findings(None, facts, None).findings}


def test_the_captured_config_is_a_granite_hybrid_in_align_mode_with_block_128() -> None:
    config = parse_snapshot(EXPOSITION.read_text(), None).cache_config
    assert config is not None and config.block_size == 128
    assert config.labels["mamba_cache_mode"] == "align"


def test_the_recipe_is_quiet() -> None:
    run = hybrid_run(tiny("granite"), RECIPE, "cpu")
    assert run is not None and (run.max_num_batched_tokens, run.chunk_size) == (128, 128)
    assert not {"vllm_hybrid_align_crash", "vllm_hybrid_state_not_cached"} & set(findings(run))


def test_vllms_default_batch_on_cpu_is_flagged_as_a_crash() -> None:
    run = hybrid_run(tiny("granite"), ("--mamba-cache-mode", "align"), "cpu")
    evidence = findings(run)["vllm_hybrid_align_crash"]
    assert "max_num_batched_tokens vLLM's CPU default 2048 > block 128" in evidence
    assert "Mamba chunk 64 < block 128" in evidence


def test_a_chunk_under_the_block_alone_is_flagged() -> None:
    run = hybrid_run(tiny("granite"), ("--max-num-batched-tokens", "128"), "cpu")
    evidence = findings(run)["vllm_hybrid_align_crash"]
    assert "Mamba chunk 64 < block 128" in evidence and "max_num_batched" not in evidence


def test_the_same_config_on_a_gpu_or_for_a_dense_model_is_quiet() -> None:
    gpu = hybrid_run(tiny("granite"), (), "gpu")
    assert "vllm_hybrid_align_crash" not in findings(gpu)
    assert "vllm_hybrid_align_crash" not in findings(None)


def test_a_hybrid_whose_state_is_not_cached_is_flagged() -> None:
    run = hybrid_run(tiny("nemotron"), (), "cpu")
    found = findings(run, {"mamba_cache_mode": "none"})
    assert "vllm_hybrid_state_not_cached" in found and "vllm_hybrid_align_crash" not in found
