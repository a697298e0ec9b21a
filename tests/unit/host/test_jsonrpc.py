"""What a JSON-RPC message that cannot be read is answered with (host/jsonrpc.py)."""

from __future__ import annotations

from graph_kvcache_mcp.host.jsonrpc import (
    INVALID_REQUEST,
    PARSE_ERROR,
    Refusal,
    readable_id,
    refuse_text,
    refuse_value,
)


def test_text_that_is_not_json_is_a_parse_error_without_an_id() -> None:
    (refusal,) = refuse_text('{"id": 1, "method": ')
    assert (refusal.id, refusal.code) == (None, PARSE_ERROR)


def test_a_lone_surrogate_escape_is_a_parse_error_that_keeps_the_id() -> None:
    (refusal,) = refuse_text('{"jsonrpc": "2.0", "id": "x", "method": "ping", "a": "\\ud83d"}')
    assert (refusal.id, refusal.code) == ("x", PARSE_ERROR)
    assert "surrogate" in refusal.message


def test_a_batch_is_refused_once_per_readable_id() -> None:
    refusals = refuse_value([{"id": 1}, {"id": "two"}, {"no": "id"}])
    assert [(r.id, r.code) for r in refusals] == [(1, INVALID_REQUEST), ("two", INVALID_REQUEST)]
    assert refuse_value([{"no": "id"}]) == [Refusal(None, INVALID_REQUEST, refusals[0].message)]


def test_each_broken_field_is_named() -> None:
    cases = {
        "params must be an object, got a string": {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "m",
            "params": "s",
        },
        "needs a method": {"jsonrpc": "2.0", "id": 1},
        'jsonrpc must be "2.0"': {"id": 1, "method": "m"},
        "method must be a string, got a number": {"jsonrpc": "2.0", "id": 1, "method": 3},
        "id must be a string or an integer, got a boolean": {
            "jsonrpc": "2.0",
            "id": True,
            "method": "m",
        },
    }
    for wanted, message in cases.items():
        (refusal,) = refuse_value(message)
        assert wanted in refusal.message, (wanted, refusal.message)


def test_only_strings_and_integers_are_ids() -> None:
    assert [readable_id({"id": v}) for v in ("a", 2, True, 1.5, None)] == ["a", 2, None, None, None]
    assert readable_id([{"id": 1}]) is None
