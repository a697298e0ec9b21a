"""Why a request missed vLLM's prefix cache: the token divergence of two requests, what vLLM will
serve from cache, and the cause. Pure: no I/O.

vLLM caches whole blocks and always computes the last prompt token, so right after the first
request the second gets `floor(min(common, second_tokens - 1) / block_size) * block_size` tokens
from its prefix cache. The cause is the first of these that matches: identical, volatile_value,
reordered, whitespace, short_prefix, new_turn, edited.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CauseKind = Literal[
    "identical", "volatile_value", "reordered", "whitespace", "short_prefix", "new_turn", "edited"
]

_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
VOLATILE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "timestamp",
        re.compile(
            r"\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
            r"|\b1\d{9}(?:\d{3})?\b"
        ),
    ),
    (
        "UUID",
        re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
    ),
    (
        "date",
        re.compile(
            rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}}/\d{{1,2}}/\d{{2,4}}\b"
            rf"|\b{_MONTH} \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}\b|\b\d{{1,2}} {_MONTH} \d{{4}}\b",
            re.I,
        ),
    ),
    ("time", re.compile(r"\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:\s?[ap]\.?m\.?)?\b", re.I)),
    (
        "nonce",
        re.compile(
            r"\b(?:nonce|salt|token|session|request|req|trace|run|seed)[ _-]?(?:id)?"
            r"\s*[:=#]\s*[\w-]+",
            re.I,
        ),
    ),
    ("hex id", re.compile(r"\b(?:0x)?(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b", re.I)),
    ("counter", re.compile(r"\d+")),
)
"""What changes from one request to the next by itself, most specific first. A number that
differs at the divergence (`counter`) counts: a request number or an attempt count."""


class Divergence(BaseModel):
    """Where two requests' prompts part: the message, and a decoded excerpt of each side."""

    model_config = ConfigDict(frozen=True)

    message_index: int | None = Field(
        description="First message that differs (None: the messages are equal)."
    )
    role: str | None = None
    first_excerpt: str = Field(description="Decoded tokens around the divergence, first request.")
    second_excerpt: str = Field(description="The same span of the second request.")


class Cause(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: CauseKind
    detail: str
    fix: str


def common_prefix(first: Sequence[object], second: Sequence[object]) -> int:
    """How many leading items (tokens, characters) the two sequences share."""
    shared = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        shared += 1
    return shared


def predicted_cached_tokens(common: int, second_tokens: int, block_size: int) -> int:
    """Prompt tokens vLLM serves from cache for the second request, right after the first."""
    if block_size <= 0:
        raise ValueError(f"block_size is {block_size}: give a positive number of tokens")
    return max(0, min(common, second_tokens - 1)) // block_size * block_size


def first_divergent_token(first: Sequence[int], second: Sequence[int]) -> int | None:
    """Index of the first token that differs (or that only one side has); None when equal."""
    if list(first) == list(second):
        return None
    return common_prefix(first, second)


def message_text(message: dict[str, Any]) -> str:
    """The text a chat message carries (string content, or its text parts joined)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else json.dumps(content, sort_keys=True)


def first_different_message(
    first: Sequence[dict[str, Any]], second: Sequence[dict[str, Any]]
) -> int | None:
    """Index of the first message that differs, or that only one request has; None if equal."""
    for index, (a, b) in enumerate(zip(first, second, strict=False)):
        if _canonical(a) != _canonical(b):
            return index
    if len(first) != len(second):
        return min(len(first), len(second))
    return None


def classify(
    first: Sequence[dict[str, Any]],
    second: Sequence[dict[str, Any]],
    *,
    common: int,
    identical_tokens: bool,
    block_size: int,
    first_extras: dict[str, Any] | None = None,
    second_extras: dict[str, Any] | None = None,
) -> Cause:
    """The cause of the divergence: the first of `CAUSE_RULES` that matches, else `edited`.

    `*_extras` are the request fields besides `messages` that reach the chat template (tools).
    """
    index = first_different_message(first, second)
    pair = _Pair(
        first=first,
        second=second,
        common=common,
        identical_tokens=identical_tokens,
        block_size=block_size,
        same_extras=(first_extras or {}) == (second_extras or {}),
        index=index,
        a=message_text(first[index]) if index is not None and index < len(first) else "",
        b=message_text(second[index]) if index is not None and index < len(second) else "",
    )
    for rule in CAUSE_RULES:
        if (cause := rule(pair)) is not None:
            return cause
    return _edited(pair)


@dataclass(frozen=True, slots=True)
class _Pair:
    """Two requests, as the cause rules read them: `index` is the first differing message,
    `a` and `b` its text on each side ("" where a side lacks it)."""

    first: Sequence[dict[str, Any]]
    second: Sequence[dict[str, Any]]
    common: int
    identical_tokens: bool
    block_size: int
    same_extras: bool
    index: int | None
    a: str
    b: str

    def where(self) -> str:
        assert self.index is not None
        return f"message {self.index} ({role_at(self.first, self.second, self.index)})"


def _identical(pair: _Pair) -> Cause | None:
    if not pair.identical_tokens:
        return None
    return Cause(
        kind="identical",
        detail="both requests tokenize to the same prompt",
        fix="nothing to fix: the second request reuses every whole block but the last token's",
    )


def _volatile_value(pair: _Pair) -> Cause | None:
    if pair.index is None or pair.index >= min(len(pair.first), len(pair.second)):
        return None
    volatile = volatile_at_divergence(pair.a, pair.b)
    if volatile is None:
        return None
    kind, value_a, value_b = volatile
    return Cause(
        kind="volatile_value",
        detail=f"{pair.where()} differs in a {kind}: {value_a!r} vs {value_b!r}",
        fix=f"move the {kind} out of the shared prefix (after the stable content, e.g. "
        "into the last user message) or drop it; everything after it is recomputed",
    )


def _reordered_content(pair: _Pair) -> Cause | None:
    if not _reordered(pair.first, pair.second, pair.a, pair.b, pair.index):
        return None
    return Cause(
        kind="reordered",
        detail="the same content in another order"
        + (f" inside message {pair.index}" if _same_items(pair.a, pair.b) else " (messages)"),
        fix="keep a stable order: sort messages, tools, documents and list items the same "
        "way on every request",
    )


def _whitespace(pair: _Pair) -> Cause | None:
    if _squash(pair.first) != _squash(pair.second) or not pair.same_extras:
        return None
    return Cause(
        kind="whitespace",
        detail=f"the texts differ only in whitespace (message {pair.index})",
        fix="normalise whitespace once (trailing spaces, newlines, indentation) before "
        "sending, and keep it byte-identical across requests",
    )


def _short_prefix(pair: _Pair) -> Cause | None:
    if pair.common >= pair.block_size:
        return None
    return Cause(
        kind="short_prefix",
        detail=f"the common prefix is {pair.common} tokens, shorter than one "
        f"{pair.block_size}-token block: vLLM caches whole blocks only",
        fix="share a longer stable prefix (system prompt, tools, documents first), or run "
        "vLLM with a smaller --block-size",
    )


def _new_conversation_turn(pair: _Pair) -> Cause | None:
    if not pair.same_extras or not _new_turn(pair.first, pair.second, pair.index):
        return None
    return Cause(
        kind="new_turn",
        detail="everything before the last user message is identical; the prompts part "
        "in the new turn",
        fix="nothing to fix: this is how a conversation reuses its prefix",
    )


def _edited(pair: _Pair) -> Cause:
    if pair.index is None:
        where = "the request fields besides messages (tools, template arguments)"
    else:
        where = pair.where()
    return Cause(
        kind="edited",
        detail=f"{where} was edited before the last user message",
        fix="keep the shared prefix byte-stable: append new content after it instead of "
        "editing earlier messages",
    )


CAUSE_RULES: tuple[Callable[[_Pair], Cause | None], ...] = (
    _identical,
    _volatile_value,
    _reordered_content,
    _whitespace,
    _short_prefix,
    _new_conversation_turn,
)
"""The causes in the order they are tried (the module docstring's); `edited` is the rest."""


def volatile_at_divergence(a: str, b: str) -> tuple[str, str, str] | None:
    """The kind of volatile value covering the first differing character of `a` and `b`, with
    each side's value; None when the texts part elsewhere."""
    if a == b:
        return None
    at = common_prefix(a, b)
    for kind, pattern in VOLATILE_PATTERNS:
        match_a = _match_covering(pattern, a, at)
        match_b = _match_covering(pattern, b, at)
        if match_a is not None and match_b is not None:
            return kind, match_a, match_b
        if kind != "counter" and (match_a is not None or match_b is not None):
            return kind, match_a or "", match_b or ""
    return None


def _match_covering(pattern: re.Pattern[str], text: str, at: int) -> str | None:
    for match in pattern.finditer(text):
        if match.start() <= at < match.end():
            return match.group()
        if match.start() > at:
            break
    return None


def role_at(
    first: Sequence[dict[str, Any]], second: Sequence[dict[str, Any]], index: int
) -> str | None:
    """The role of message `index` (the first request's, else the second's)."""
    messages = first if index < len(first) else second
    return str(messages[index].get("role")) if index < len(messages) else None


def _canonical(message: dict[str, Any]) -> str:
    return json.dumps(message, sort_keys=True, ensure_ascii=False)


def _squash(messages: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(str(m.get("role")), "".join(message_text(m).split())) for m in messages]


def _same_items(a: str, b: str) -> bool:
    """The same lines (or comma/semicolon-separated items) in another order."""
    if a == b:
        return False
    for separator in ("\n", r"[,;]\s*"):
        items_a = [i.strip() for i in re.split(separator, a) if i.strip()]
        items_b = [i.strip() for i in re.split(separator, b) if i.strip()]
        if len(items_a) > 1 and sorted(items_a) == sorted(items_b) and items_a != items_b:
            return True
    return False


def _reordered(
    first: Sequence[dict[str, Any]],
    second: Sequence[dict[str, Any]],
    a: str,
    b: str,
    index: int | None,
) -> bool:
    if sorted(map(_canonical, first)) == sorted(map(_canonical, second)):
        return index is not None
    if index is None or index >= min(len(first), len(second)):
        return False
    return first[index].get("role") == second[index].get("role") and _same_items(a, b)


def _new_turn(
    first: Sequence[dict[str, Any]], second: Sequence[dict[str, Any]], index: int | None
) -> bool:
    if index is None:
        return False
    if index == len(first):  # the second request only adds turns
        return True
    last_user = max(
        (i for i, m in enumerate(second) if m.get("role") == "user"), default=len(second)
    )
    return index >= last_user and index == len(first) - 1
