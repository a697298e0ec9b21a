"""Plain text from what other programs wrote: no terminal escapes, no control characters.

Reasons quote the logs of the engine, vLLM and LMCache, which colour their output. A reason goes
to tool results, the CLI and our own logs, where an escape sequence would recolour (or rewrite) a
terminal, so every quoted log line passes through here first.
"""

from __future__ import annotations

import re

# CSI (ESC [ ... final byte), OSC (ESC ] ... BEL or ESC \), and any other two-byte ESC sequence.
_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?|\x9b")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain_text(text: str) -> str:
    """`text` without terminal escape sequences and control characters (newlines and tabs
    stay)."""
    return _CONTROL.sub("", _ESCAPE.sub("", text))
