"""`diagnose miss` prints the tier answer (one line per tier, early exits, mismatches) under the
vLLM part, so the CLI says what the tool's `tiers` says."""

from __future__ import annotations

from graph_kvcache_mcp.commands.diagnose import _describe_miss
from graph_kvcache_mcp.domain.diagnosis.tier_miss import TierMiss, TierVerdict
from graph_kvcache_mcp.services.diagnosis.prefix_miss import MissDiagnosis


def test_the_human_text_has_a_line_per_tier_and_each_mismatch() -> None:
    tiers = TierMiss(
        lmcache_url="http://127.0.0.1:9",
        prompt_tokens=1000,
        cached_tokens=768,
        tiers=[
            TierVerdict(tier="vllm", held_tokens=0, serves_tokens=0, why="restarted", detail="r"),
            TierVerdict(tier="l1", held_tokens=768, serves_tokens=768, why="served", detail="s"),
            TierVerdict(tier="l2", held_tokens=768, serves_tokens=0, why="not_needed", detail="n"),
        ],
        early_exits={"no_gpu_context": "2 lookup(s): no vLLM"},
        mismatches=["chunk size 100 is not a multiple"],
    )
    text = _describe_miss(MissDiagnosis(reachable=True, model="m", tiers=tiers))
    assert "next request gets 768 cached" in text
    assert "  l1: holds 768, serves 768: served: s" in text
    assert "early exit no_gpu_context" in text and "mismatch: chunk size 100" in text
