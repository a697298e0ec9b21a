"""Token counters for the budget fit. Pure: a counter is handed the texts, never fetches anything.

The default is an estimate; an exact count comes from the served model's tokenizer (vLLM
`/tokenize`), which is I/O and therefore lives in a connector: the service asks it for every part
a compile could use (`budget_parts`), then hands the answers in as a `PrecountedCounter`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol


class TokenCounter(Protocol):
    """Counts tokens of rendered parts. `name` goes into the cache key: a budget fitted with one
    tokenizer is not the same bundle as one fitted with another."""

    @property
    def name(self) -> str: ...

    def count_many(self, texts: Sequence[str]) -> list[int]: ...


BYTES_PER_TOKEN = 4
"""Byte-level BPE tokenizers average about four bytes of English per token; counting UTF-8 bytes
(not characters) keeps non-Latin scripts, which take more tokens per character, on the safe side."""


class EstimateCounter:
    """ceil(UTF-8 bytes / 4) per part: no tokenizer needed, usually within ±25 % for English."""

    name = f"estimate/utf8-bytes-div-{BYTES_PER_TOKEN}"

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return [math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN) for text in texts]


class PrecountedCounter:
    """Counts looked up from a table someone filled beforehand (e.g. from vLLM `/tokenize`)."""

    def __init__(self, name: str, counts: Mapping[str, int]) -> None:
        self.name = name
        self._counts = dict(counts)

    def __repr__(self) -> str:
        return f"PrecountedCounter({self.name!r}, {len(self._counts)} parts)"

    def count_many(self, texts: Sequence[str]) -> list[int]:
        missing = [text for text in texts if text not in self._counts]
        if missing:
            # A part the service did not pre-count means budget_parts and the compile disagree:
            # a bug, not a caller mistake.
            raise LookupError(f"{len(missing)} part(s) were not pre-counted")
        return [self._counts[text] for text in texts]
