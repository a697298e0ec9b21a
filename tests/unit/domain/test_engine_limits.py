"""The engine's limits and a call's time budget."""

from __future__ import annotations

from graph_kvcache_mcp.domain.engine.limits import (
    MAX_VALUE_BYTES,
    MIN_UPLOAD_RATE_BYTES_S,
    call_budget_s,
)


def test_a_call_without_a_body_gets_exactly_the_timeout() -> None:
    assert call_budget_s(5.0) == 5.0


def test_the_largest_value_adds_its_upload_time_at_the_slowest_rate() -> None:
    assert call_budget_s(5.0, MAX_VALUE_BYTES) == 5.0 + MAX_VALUE_BYTES / MIN_UPLOAD_RATE_BYTES_S
    assert 12.9 < call_budget_s(5.0, MAX_VALUE_BYTES) < 13.0
