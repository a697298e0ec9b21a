"""Reasons quote other programs' logs as plain text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from graph_kvcache_mcp.domain.plain_text import plain_text


def test_colours_cursor_moves_and_titles_are_removed() -> None:
    line = "\x1b[2m2026\x1b[0m \x1b[31mERROR\x1b[0m bind: \x1b]0;owned\x07in use\x1b[2K\r\x08!"
    assert plain_text(line) == "2026 ERROR bind: in use!"


def test_newlines_tabs_and_unicode_stay() -> None:
    assert plain_text("a\tb\nc — ü") == "a\tb\nc — ü"


@given(st.text())
def test_no_escape_or_control_survives(text: str) -> None:
    assert all(
        char in "\n\t" or char.isprintable() or ord(char) > 0x9F for char in plain_text(text)
    )
    assert "\x1b" not in plain_text(text)
