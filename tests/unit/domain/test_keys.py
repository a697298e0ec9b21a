from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graph_kvcache_mcp.domain.keys import MAX_KEY_BYTES, check_key, is_valid_key
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
        ("x" * (MAX_KEY_BYTES + 1), "length"),
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
    assert is_valid_key("k" * MAX_KEY_BYTES)


@given(st.text(SAFE_ALPHABET, min_size=1, max_size=200))
def test_printable_ascii_keys_without_forbidden_characters_pass_unless_reserved(key: str) -> None:
    reserved = key in {"stats", "version", "snapshot", "fork/stats"} or key.startswith(
        ("version/", "branch/", "snapshot/")
    )
    assert is_valid_key(key) == (not reserved and not key.endswith("/exists"))


@given(st.text(min_size=1, max_size=50), st.sampled_from(["?", "#", " ", "\n", "\x7f", "\u00e9"]))
def test_any_key_holding_a_forbidden_character_is_refused(prefix: str, bad: str) -> None:
    assert not is_valid_key(prefix + bad)
