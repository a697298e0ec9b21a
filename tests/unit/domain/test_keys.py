from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graph_kvcache_mcp.domain.engine.keys import (
    KeyBackend,
    check_exists_key,
    check_key,
    is_valid_key,
)
from graph_kvcache_mcp.domain.engine.limits import (
    DURABLE_MAX_KEY_BYTES,
    LONGEST_KEY_BYTES,
    MAX_EXISTS_KEY_BYTES,
    MEMORY_MAX_KEY_BYTES,
)
from graph_kvcache_mcp.errors import InvalidKey

SAFE_ALPHABET = st.sampled_from([chr(c) for c in range(0x21, 0x7F) if chr(c) not in "?#"])


@pytest.mark.parametrize(
    ("key", "rule"),
    [
        ("", "empty"),
        ("caf\u00e9", "charset"),
        ("tab\there", "charset"),
        ("a?b", "charset"),
        ("a#b", "charset"),
        ("a b", "charset"),
        ("x" * (LONGEST_KEY_BYTES + 1), "length"),
        ("stats", "reserved"),
        ("version", "reserved"),
        ("snapshot", "reserved"),
        ("fork/stats", "reserved"),
        ("version/3", "reserved"),
        ("branch/0/k", "reserved"),
        ("snapshot/1/fork", "reserved"),
        ("foo/exists", "exists-suffix"),
    ],
)
def test_check_key_names_the_rule_a_key_breaks(key: str, rule: str) -> None:
    with pytest.raises(InvalidKey) as caught:
        check_key(key)
    assert caught.value.rule == rule
    assert rule in str(caught.value)


@pytest.mark.parametrize(
    "key",
    ["a/b/c", "ctxbundle:" + "ab" * 32, "exists", "x/exists/y", "..", "/lead", "trail/", "a%2Fb"],
)
def test_check_key_accepts_keys_the_engine_stores_verbatim(key: str) -> None:
    assert check_key(key) == key


def test_the_longest_allowed_key_is_accepted() -> None:
    assert is_valid_key("k" * LONGEST_KEY_BYTES)


@pytest.mark.parametrize(
    ("backend", "limit", "named"),
    [
        ("memory", MEMORY_MAX_KEY_BYTES, "memory backend"),
        ("durable", DURABLE_MAX_KEY_BYTES, "durable backend"),
        ("unknown", DURABLE_MAX_KEY_BYTES, "did not report its backend"),
        ("any", LONGEST_KEY_BYTES, "no engine backend"),
    ],
)
def test_each_backend_holds_keys_to_its_own_length_and_says_whose_limit_it_is(
    backend: KeyBackend, limit: int, named: str
) -> None:
    assert check_key("k" * limit, backend=backend)
    with pytest.raises(InvalidKey, match=named) as caught:
        check_key("k" * (limit + 1), backend=backend)
    assert caught.value.rule == "length" and f"at most {limit} bytes" in str(caught.value)


def test_the_exists_route_takes_seven_bytes_less_and_says_to_use_contains() -> None:
    assert check_exists_key("k" * MAX_EXISTS_KEY_BYTES)
    with pytest.raises(InvalidKey, match="contains"):
        check_exists_key("k" * (MAX_EXISTS_KEY_BYTES + 1))


@given(st.text(SAFE_ALPHABET, min_size=1, max_size=200))
def test_printable_ascii_keys_without_forbidden_characters_pass_unless_reserved(key: str) -> None:
    reserved = key in {"stats", "version", "snapshot", "fork/stats"} or key.startswith(
        ("version/", "branch/", "snapshot/")
    )
    assert is_valid_key(key) == (not reserved and not key.endswith("/exists"))


@given(st.text(min_size=1, max_size=50), st.sampled_from(["?", "#", " ", "\n", "\x7f", "\u00e9"]))
def test_any_key_holding_a_forbidden_character_is_refused(prefix: str, bad: str) -> None:
    assert not is_valid_key(prefix + bad)


def test_a_key_with_several_bad_characters_names_them_all_in_one_refusal() -> None:
    with pytest.raises(InvalidKey, match="rule: charset") as refused:
        check_key("a?b#c d\u00e9\n")
    message = str(refused.value)
    for named in ("'?'", "'#'", "' '", "'\u00e9'", "'\\n'"):
        assert f"remove {named}" in message or f", {named}" in message, (named, message)
