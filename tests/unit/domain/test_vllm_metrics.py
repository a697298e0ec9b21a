"""The /metrics parser on a real vLLM capture and variants of it (models, engines, old servers)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from graph_kvcache_mcp.domain.vllm.metrics import (
    MetricsSnapshot,
    UnknownModel,
    delta,
    parse_snapshot,
    relevant_lines,
    snapshot_from_families,
)
from tests.support.expositions import (
    CAPTURED_MODEL,
    captured,
    drop_families,
    widen,
    with_external_tier,
)


def full_parse(text: str, model: str | None) -> MetricsSnapshot:
    return snapshot_from_families(text_string_to_metric_families(text), model)


def test_captured_exposition_reads_as_the_counters_vllm_reported() -> None:
    snapshot = parse_snapshot(captured(), CAPTURED_MODEL)
    assert snapshot.model_name == CAPTURED_MODEL
    assert snapshot.engines == ["0"]
    assert (snapshot.prefix_cache_queries_tokens, snapshot.prefix_cache_hits_tokens) == (
        4584,
        3008,
    )
    assert snapshot.prefix_cache_hit_rate == pytest.approx(3008 / 4584)
    assert snapshot.prompt_tokens_by_source == {
        "external_kv_transfer": 0,
        "local_cache_hit": 3008,
        "local_compute": 1576,
    }
    assert snapshot.prompt_tokens_cached_by_source is not None
    assert snapshot.prompt_tokens_cached_by_source["device"] == 3008
    assert (
        snapshot.external_prefix_cache_queries_tokens,
        snapshot.external_prefix_cache_hit_rate,
    ) == (
        0,
        None,
    )
    assert (snapshot.requests_running, snapshot.requests_waiting) == (0, 0)
    assert snapshot.kv_cache_usage_perc == 0.0
    assert snapshot.ttft is not None and snapshot.ttft.count == 3
    assert snapshot.ttft.p50_s is not None and 0.01 <= snapshot.ttft.p50_s <= 0.02
    assert snapshot.cache_config is not None
    assert (snapshot.cache_config.block_size, snapshot.cache_config.enable_prefix_caching) == (
        32,
        True,
    )
    assert snapshot.cache_config.kv_cache_memory_bytes == 256 * 1024 * 1024


@pytest.mark.parametrize("model", [CAPTURED_MODEL, None])
def test_filtered_parse_equals_a_full_parse_of_the_capture(model: str | None) -> None:
    text = captured()
    assert parse_snapshot(text, model) == full_parse(text, model)


def test_engine_kv_connector_counters_are_read_and_move_in_a_delta() -> None:
    text = with_external_tier(captured(), queries=900, hits=768, engine_bytes=589_824)
    before = parse_snapshot(text, CAPTURED_MODEL)
    assert before == full_parse(text, CAPTURED_MODEL)
    assert (before.external_prefix_cache_hits_tokens, before.engine_kv_loaded_bytes) == (
        768,
        589_824,
    )
    after = parse_snapshot(widen(text, [(CAPTURED_MODEL, "0", 3)]), CAPTURED_MODEL)
    moved = delta(before, after)
    assert (moved.external_prefix_cache_hits_tokens, moved.engine_kv_loaded_bytes) == (
        2 * 768,
        2 * 589_824,
    )
    assert parse_snapshot(captured(), CAPTURED_MODEL).engine_kv_loaded_bytes is None


def test_several_models_and_engines_are_kept_apart_and_engines_summed() -> None:
    other = 'org/odd "quoted" \\ model'
    text = widen(captured(), [("alpha", "0", 1), ("alpha", "1", 2), (other, "2", 5)])
    alpha = parse_snapshot(text, "alpha")
    odd = parse_snapshot(text, other)
    everything = parse_snapshot(text)
    assert alpha.engines == ["0", "1"]
    assert alpha.prefix_cache_hits_tokens == 3008 * 3
    assert alpha.ttft is not None and alpha.ttft.count == 3 * 3
    assert odd.engines == ["2"]
    assert odd.prefix_cache_hits_tokens == 3008 * 5
    assert odd.cache_config is not None and odd.cache_config.labels["engine"] == "2"
    assert alpha.cache_config is None  # its two engines report two configs: no single answer
    assert everything.model_name is None
    assert everything.prefix_cache_hits_tokens == 3008 * 8
    for model in ("alpha", other, None):
        assert parse_snapshot(text, model) == full_parse(text, model)


def test_missing_families_read_as_none_never_zero() -> None:
    text = drop_families(
        captured(),
        [
            "vllm:external_prefix_cache",
            "vllm:prompt_tokens_by_source",
            "vllm:prompt_tokens_cached",
            "vllm:time_to_first_token",
            "vllm:cache_config_info",
        ],
    )
    snapshot = parse_snapshot(text, CAPTURED_MODEL)
    assert snapshot.prefix_cache_hits_tokens == 3008
    assert snapshot.external_prefix_cache_queries_tokens is None
    assert snapshot.external_prefix_cache_hits_tokens is None
    assert snapshot.prompt_tokens_by_source is None
    assert snapshot.prompt_tokens_cached is None
    assert snapshot.prompt_tokens_cached_by_source is None
    assert snapshot.ttft is None
    assert snapshot.cache_config is None
    assert snapshot == full_parse(text, CAPTURED_MODEL)


def test_an_exposition_without_vllm_series_gives_an_all_none_snapshot() -> None:
    text = drop_families(captured(), ["vllm:"])
    snapshot = parse_snapshot(text)
    assert snapshot.engines == []
    assert snapshot.prefix_cache_hits_tokens is None
    assert snapshot.prefix_cache_hit_rate is None


def test_unknown_model_names_the_models_the_server_reports() -> None:
    text = widen(captured(), [("alpha", "0", 1), ("beta", "0", 1)])
    with pytest.raises(UnknownModel, match="alpha, beta") as caught:
        parse_snapshot(text, "gamma")
    assert caught.value.served == ["alpha", "beta"]


def test_a_label_that_merely_contains_the_model_text_is_not_counted() -> None:
    decoy = (
        'vllm:prefix_cache_hits_total{engine="0",model_name="other",'
        'served_model_name="tiny-llama"} 999.0'
    )
    text = captured().replace(
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"# TYPE vllm:prefix_cache_hits_total counter\n{decoy}",
    )
    assert decoy in relevant_lines(text, CAPTURED_MODEL)  # the line filter keeps too much ...
    assert parse_snapshot(text, CAPTURED_MODEL).prefix_cache_hits_tokens == 3008  # ... not this


def test_text_that_is_not_an_exposition_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_snapshot('vllm:prefix_cache_hits_total{engine="0" 1.0\n')


@settings(max_examples=40, deadline=None)
@given(model=st.text(min_size=1, max_size=24))
def test_filtered_parse_equals_full_parse_for_any_model_name(model: str) -> None:
    text = widen(captured(), [(model, "0", 1), ("neighbour", "0", 2)])
    assert parse_snapshot(text, model) == full_parse(text, model)


def test_delta_is_the_move_of_each_counter_with_the_window_hit_rate() -> None:
    before = parse_snapshot(widen(captured(), [("m", "0", 1)]), "m")
    after = parse_snapshot(widen(captured(), [("m", "0", 3)]), "m").model_copy(
        update={"scraped_at": 12.5}
    )
    window = delta(before.model_copy(update={"scraped_at": 10.0}), after)
    assert window.prefix_cache_hits_tokens == 3008 * 2
    assert window.prefix_cache_queries_tokens == 4584 * 2
    assert window.prefix_cache_hit_rate == pytest.approx(3008 / 4584)
    assert window.requests_with_first_token == 6
    assert window.window_s == 2.5
    assert window.counter_reset is False


def test_delta_flags_a_restart_instead_of_negative_counts() -> None:
    before = parse_snapshot(widen(captured(), [("m", "0", 3)]), "m")
    after = parse_snapshot(widen(captured(), [("m", "0", 1)]), "m")
    window = delta(before, after)
    assert window.counter_reset is True
    assert window.prefix_cache_hits_tokens is None
    assert window.ttft is None


def test_delta_of_a_missing_family_stays_none() -> None:
    text = drop_families(captured(), ["vllm:external_prefix_cache"])
    snapshot = parse_snapshot(text, CAPTURED_MODEL)
    window = delta(snapshot, snapshot)
    assert window.external_prefix_cache_hits_tokens is None
    assert window.prefix_cache_hits_tokens == 0
    assert window.prefix_cache_hit_rate is None


def test_delta_from_a_snapshot_read_back_from_json_has_counts_but_no_made_up_quantiles() -> None:
    before = parse_snapshot(widen(captured(), [("m", "0", 1)]), "m")
    after = parse_snapshot(widen(captured(), [("m", "0", 2)]), "m")
    echoed = MetricsSnapshot.model_validate_json(before.model_dump_json())
    window = delta(echoed, after)
    assert echoed.ttft_buckets is None
    assert window.ttft is not None and window.ttft.count == 3
    assert (window.ttft.p50_s, window.ttft.p95_s) == (None, None)
    assert delta(before, after).ttft is not None
