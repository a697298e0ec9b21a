"""The rules that explain a prompt's miss per tier (vLLM, LMCache L1, L2), on reported facts.
Each is checked against the real stack in tests/integration/fleet/test_tier_miss.py; here the
cases the stack cannot be made to show cheaply: failing stores, another server, a restarted
server, early exits, a hash the coordinator computes differently, a salt."""

from __future__ import annotations

from graph_kvcache_mcp.domain.diagnosis.tier_facts import (
    DirectoryFacts,
    ServerCounters,
    TierFacts,
    directory_facts,
    parse_server_counters,
)
from graph_kvcache_mcp.domain.diagnosis.tier_miss import TierMiss, explain_tiers, salt_mismatch
from graph_kvcache_mcp.domain.fleet.tiers import TierHeld
from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters, parse_lmcache_counters
from graph_kvcache_mcp.domain.vllm.chat import CachedTokens, split_lmcache_tiers

N = 1000  # prompt tokens: 3 whole chunks of 256 (768), vLLM blocks of 32


def held(tokens: int | None, reason: str | None = None) -> TierHeld:
    return TierHeld(tokens=tokens, trusted=tokens is not None, source="test", reason=reason)


def facts(
    vllm: int | None = 0, l1: int | None = 0, l2: int | None = 0, **more: object
) -> TierFacts:
    base: dict[str, object] = {
        "prompt_tokens": N,
        "block_size": 32,
        "chunk_size": 256,
        "tiers": {"vllm": held(vllm), "l1": held(l1), "l2": held(l2)},
        "vllm_counted_prompt_tokens": 50_000,
    }
    return TierFacts.model_validate(base | more)


def whys(miss: TierMiss) -> list[tuple[str, str, int | None]]:
    return [(v.tier, v.why, v.serves_tokens) for v in miss.tiers]


def test_a_prompt_no_tier_holds_misses_everywhere_as_never_stored() -> None:
    miss = explain_tiers(facts(), lmcache_url="u")
    assert miss.cached_tokens == 0
    assert whys(miss) == [
        ("vllm", "never_stored", 0),
        ("l1", "never_stored", 0),
        ("l2", "never_stored", 0),
    ]


def test_after_a_vllm_restart_l1_serves_the_whole_chunks_and_l2_is_not_needed() -> None:
    miss = explain_tiers(
        facts(vllm=None, l1=768, l2=768, vllm_counted_prompt_tokens=0), lmcache_url="u"
    )
    assert miss.cached_tokens == 768
    assert whys(miss) == [("vllm", "restarted", 0), ("l1", "served", 768), ("l2", "not_needed", 0)]


def test_l2_serves_what_l1_lost_and_l1_says_evicted() -> None:
    counters = ServerCounters(l1_evicted_chunks=7)
    miss = explain_tiers(facts(l1=0, l2=768, counters=counters), lmcache_url="u")
    assert whys(miss) == [("vllm", "evicted", 0), ("l1", "evicted", 0), ("l2", "served", 768)]
    assert "7 chunks" in miss.tiers[1].detail


def test_l1_then_l2_split_the_connector_part_past_vllms_own_hit() -> None:
    miss = explain_tiers(facts(vllm=320, l1=256, l2=768), lmcache_url="u")
    assert miss.cached_tokens == 768
    assert whys(miss) == [("vllm", "served", 320), ("l1", "not_needed", 0), ("l2", "served", 448)]


def test_vllm_serving_more_than_the_connector_leaves_the_tiers_not_needed() -> None:
    miss = explain_tiers(facts(vllm=992, l1=768, l2=768), lmcache_url="u")
    assert miss.cached_tokens == 992  # vLLM's whole blocks before the last token
    assert [v.why for v in miss.tiers] == ["served", "not_needed", "not_needed"]


def test_an_unknown_vllm_cache_leaves_the_total_unknown() -> None:
    miss = explain_tiers(facts(vllm=None, l1=768), lmcache_url="u")
    assert miss.cached_tokens is None
    assert whys(miss) == [
        ("vllm", "unknown", None),
        ("l1", "unknown", None),
        ("l2", "never_stored", 0),
    ]


def test_failing_l2_stores_are_named_from_the_servers_counters() -> None:
    counters = ServerCounters(l2_store_submitted_chunks=12, l2_store_completed_chunks=3)
    miss = explain_tiers(facts(counters=counters), lmcache_url="u")
    assert miss.tiers[2].why == "stores_failing" and "9 of 12" in miss.tiers[2].detail


def test_an_engine_that_does_not_answer_reads_as_down_never_as_a_miss() -> None:
    tiers = {"vllm": held(0), "l1": held(0), "l2": held(None, "unknown: engine not reachable")}
    miss = explain_tiers(facts(tiers=tiers), lmcache_url="u")
    assert (miss.tiers[2].why, miss.tiers[2].serves_tokens) == ("down", None)


def test_another_server_holding_it_in_l1_is_named() -> None:
    directory = DirectoryFacts(chunks=3, l1_elsewhere=["other-id"])
    miss = explain_tiers(facts(directory=directory), lmcache_url="u")
    assert miss.tiers[1].why == "other_server" and "other-id" in miss.tiers[1].detail


def test_l2_stored_by_a_server_no_longer_registered_means_this_server_restarted() -> None:
    directory = DirectoryFacts(chunks=3, l2_by_gone=True)
    miss = explain_tiers(facts(l2=768, directory=directory), lmcache_url="u")
    assert miss.tiers[1].why == "server_restarted"


def test_a_prompt_shorter_than_a_chunk_says_so() -> None:
    miss = explain_tiers(facts(prompt_tokens=200), lmcache_url="u")
    assert [v.why for v in miss.tiers[1:]] == ["too_short", "too_short"]


def test_mismatches_chunk_block_hash_and_the_coordinators_cut_and_hashes() -> None:
    odd = explain_tiers(facts(block_size=48, hash_algorithm="sha256_cbor"), lmcache_url="u")
    assert any("multiple of vLLM's block size 48" in m for m in odd.mismatches)
    assert any("PYTHONHASHSEED" in m for m in odd.mismatches)
    seeded = facts(hash_algorithm="builtin", hash_seeds={"vllm": None, "server": "0"})
    named = explain_tiers(seeded, lmcache_url="u").mismatches
    assert any("(server 0, vllm unset: they differ" in m for m in named)
    cut = explain_tiers(facts(directory=DirectoryFacts(chunks=1)), lmcache_url="u")
    assert any("--chunk-size 256" in m for m in cut.mismatches)
    hashed = facts(
        directory=DirectoryFacts(chunks=3, chunk_hashes=["aa", "bb", "cc"]),
        expected_hashes=["ff", "bb", "cc"],
    )
    assert any("--hash-algorithm" in m for m in explain_tiers(hashed, lmcache_url="u").mismatches)
    same = facts(directory=DirectoryFacts(chunks=3, chunk_hashes=["ff"]), expected_hashes=["ff"])
    assert explain_tiers(same, lmcache_url="u").mismatches == []


def test_salts_that_differ_are_a_mismatch_and_equal_ones_are_not() -> None:
    assert salt_mismatch(None, None) is None and salt_mismatch("a", "a") is None
    assert "cache_salt" in (salt_mismatch("a", "b") or "")


def test_server_counters_and_early_exits_parse_from_lmcaches_exposition() -> None:
    text = "\n".join(
        [
            "# TYPE lmcache_mp_lookup_early_exit_requests_total counter",
            "lmcache_mp_lookup_early_exit_requests_total"
            '{model_name="m",reason="no_gpu_context"} 2.0',
            "# TYPE lmcache_mp_l1_evicted_chunks_total counter",
            "lmcache_mp_l1_evicted_chunks_total 5.0",
            "# TYPE lmcache_mp_l2_store_submitted_objects_chunks_total counter",
            'lmcache_mp_l2_store_submitted_objects_chunks_total{cache_salt=""} 6.0',
            "# TYPE lmcache_mp_l2_store_completed_objects_chunks_total counter",
            'lmcache_mp_l2_store_completed_objects_chunks_total{cache_salt=""} 6.0',
            "# TYPE vllm_other counter",
            "vllm_other_total 9.0",
        ]
    )
    counters = parse_server_counters(text + "\n")
    assert counters == ServerCounters(
        early_exits={"no_gpu_context": 2},
        l1_evicted_chunks=5,
        l2_store_submitted_chunks=6,
        l2_store_completed_chunks=6,
    )
    miss = explain_tiers(facts(counters=counters), lmcache_url="u")
    assert (
        "no_gpu_context" in miss.early_exits and "model name" in miss.early_exits["no_gpu_context"]
    )
    assert parse_server_counters("") == ServerCounters()


def test_directory_facts_read_the_first_chunks_placements() -> None:
    lookup = {
        "chunks": 2,
        "results": [
            {
                "key": {"chunk_hash_hex": "ab"},
                "placements": [
                    {"instance_id": "me", "tier": "l1"},
                    {"instance_id": "peer", "tier": "l1"},
                    {"instance_id": "dead", "tier": "l2"},
                ],
            },
            {"key": {"chunk_hash_hex": "cd"}, "placements": []},
        ],
    }
    got = directory_facts(
        lookup, [{"instance_id": "me"}, {"instance_id": "peer"}], this_instance="me"
    )
    assert got == DirectoryFacts(
        chunks=2, chunk_hashes=["ab", "cd"], l1_elsewhere=["peer"], l2_by_gone=True
    )


def test_a_split_trace_says_why_lmcache_found_less_than_it_was_asked_for() -> None:
    cold = CachedTokens(hit_tokens=0, source="usage", external_tokens=0)
    moved = LmcacheCounters(
        lookups=1, lookup_tokens=768, hit_tokens=256, l1_hit_tokens=256, l2_hit_tokens=0
    )
    split = split_lmcache_tiers(cold, moved)
    assert (split.l1_tokens, split.l2_tokens) == (0, 0)
    assert split.note is not None and "held 256 of the 768" in split.note
    exited = moved.model_copy(update={"early_exits": 1, "hit_tokens": 0, "l1_hit_tokens": 0})
    note = split_lmcache_tiers(cold, exited).note
    assert note is not None and "early exit" in note
    whole = moved.model_copy(update={"hit_tokens": 768, "l1_hit_tokens": 768})
    assert split_lmcache_tiers(cold, whole).note is None


def test_the_early_exit_counter_is_read_with_the_lookup_counters() -> None:
    text = (
        "# TYPE lmcache_mp_lookup_early_exit_requests_total counter\n"
        'lmcache_mp_lookup_early_exit_requests_total{reason="no_gpu_context"} 3.0\n'
    )
    assert parse_lmcache_counters(text).early_exits == 3
