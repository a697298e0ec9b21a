"""The bundle's text and chat messages. Pure.

The text is built only from strings (ids, kinds, evidence text, source refs, relation names):
no scores, no floats, no timestamps, nothing that depends on the clock. It is the concatenation of
parts, and the budget fit counts exactly these parts, so "tokens used" describes the text sent.

Layout (every part ends in a line break):

    Evidence bundle (most relevant first; cite items by [id]).

    [<id>] (<kind>)
    <text>

    Citations:
    - [<id>] <ref>; <ref>

    Proof graph:
    - [<id>] supports [<id>]

The citations and proof-graph sections appear only when they have lines; their headings are
counted against the budget either way (a few tokens, on the safe side).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

HEADER = "Evidence bundle (most relevant first; cite items by [id]).\n"
CITATIONS_HEADING = "\nCitations:\n"
PROOF_HEADING = "\nProof graph:\n"
FIXED_PARTS = (HEADER, CITATIONS_HEADING, PROOF_HEADING)

DEFAULT_PREAMBLE = (
    "Answer from the evidence bundle below. Cite the items you rely on by their [id], and say "
    "so when the evidence does not settle the question."
)
PREAMBLE_SEPARATOR = "\n\n"


def item_part(item_id: str, kind: str, text: str) -> str:
    return f"\n[{item_id}] ({kind})\n{text}\n"


def citation_part(item_id: str, source_refs: Sequence[str]) -> str:
    return f"- [{item_id}] {'; '.join(source_refs)}\n"


def edge_part(source: str, relation: str, target: str) -> str:
    return f"- [{source}] {relation} [{target}]\n"


def render_text(
    items: Iterable[tuple[str, str, str, Sequence[str]]],
    edges: Iterable[tuple[str, str, str]],
) -> str:
    """The text from (id, kind, text, source_refs) in order and (source, relation, target)."""
    ordered = list(items)
    parts = [HEADER]
    parts += [item_part(item_id, kind, text) for item_id, kind, text, _ in ordered]
    citations = [citation_part(item_id, refs) for item_id, _, _, refs in ordered if refs]
    if citations:
        parts += [CITATIONS_HEADING, *citations]
    edge_lines = [edge_part(*edge) for edge in edges]
    if edge_lines:
        parts += [PROOF_HEADING, *edge_lines]
    return "".join(parts)


class ChatMessage(BaseModel):
    """One chat message in the OpenAI shape (`model_dump()` is what the API takes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["system", "user", "assistant"] = Field(description="Speaker.")
    content: str = Field(description="The text.")


def system_message_text(bundle_text: str, system_preamble: str) -> str:
    """Preamble, a blank line, then the bundle: the stable prefix every turn shares."""
    if not system_preamble:
        return bundle_text
    return system_preamble + PREAMBLE_SEPARATOR + bundle_text


def prompt_messages(
    bundle_text: str,
    turn_text: str,
    *,
    system_preamble: str = DEFAULT_PREAMBLE,
    history: Sequence[ChatMessage] | None = None,
) -> list[ChatMessage]:
    """[system, *history, user]: history goes after the bundle so the prefix stays shared.

    Raises:
        ValueError: history holds a system message (the bundle's system message comes first).
    """
    earlier = list(history or ())
    if any(message.role == "system" for message in earlier):
        raise ValueError("history may hold only user and assistant messages")
    return [
        ChatMessage(role="system", content=system_message_text(bundle_text, system_preamble)),
        *earlier,
        ChatMessage(role="user", content=turn_text),
    ]
