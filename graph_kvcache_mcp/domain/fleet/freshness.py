"""How far an instance's event feed can be trusted: sequence tracking and its report.

vLLM numbers each published batch from 0. A number past the next one means batches were lost
(the subscriber's queue overflowed, or it connected late): replay from the buffer closes the gap.
A number at or below the last one means the instance restarted (its numbering began again): its
entries are dropped and rebuilt from its new buffer. Pure: times are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Step = Literal["next", "duplicate", "gap", "reset"]
RECENT_BATCHES = 4096
FeedState = Literal["live", "partial", "stale", "no_feed", "unreachable", "never_heard"]


@dataclass(slots=True)
class SequenceTracker:
    """The last batch applied, and what went wrong on the way."""

    last_seq: int = -1
    gaps: int = 0
    resets: int = 0
    replays: int = 0
    history_complete: bool = True
    """False when a replay could not reach back far enough (vLLM's buffer had moved on)."""
    last_batch_ts: float | None = None
    last_heard_at: float | None = None
    synced: bool = False
    """A replay answered to its end: the index holds the feed's whole (buffered) history."""

    recent: dict[int, float] = field(default_factory=dict)
    """Timestamps of the batches applied lately, by number: a number seen again with the same
    timestamp is the same batch (live and replay overlap); with another, a restarted process."""

    def classify(self, seq: int, ts: float) -> Step:
        """What a batch numbered `seq`, published at `ts`, means after what was applied."""
        if seq == self.last_seq + 1:
            return "next"
        if seq > self.last_seq:
            return "gap"
        if self.recent.get(seq) == ts:
            return "duplicate"
        return "reset"

    def applied(self, seq: int, ts: float, now: float) -> None:
        self.last_seq = max(self.last_seq, seq)
        self.last_batch_ts = ts
        self.last_heard_at = now
        self.recent[seq] = ts
        if len(self.recent) > RECENT_BATCHES:
            floor = self.last_seq - RECENT_BATCHES // 2
            self.recent = {s: t for s, t in self.recent.items() if s > floor}

    def restarted(self) -> None:
        self.resets += 1
        self.last_seq = -1
        self.history_complete = True
        self.recent = {}


class Freshness(BaseModel):
    """How fresh one instance's part of the index is."""

    model_config = ConfigDict(frozen=True)

    state: FeedState = Field(
        description="live: read up to now; partial: some history was lost (answers may be "
        "short); stale: its replay socket did not answer (entries may be out of date); no_feed: "
        "no kv_events configured; unreachable: the instance does not answer, its entries are "
        "not trusted; never_heard: nothing came from its feed."
    )
    last_seq: int | None = Field(None, description="Last batch number applied (None: none).")
    last_event_age_s: float | None = Field(
        None, description="Seconds since the last batch was published (by its own timestamp)."
    )
    gaps: int = Field(0, description="Sequence gaps seen (each one closed by a replay).")
    resets: int = Field(0, description="Restarts detected (numbering began again).")
    replays: int = 0
    history_complete: bool = Field(
        True, description="False when a replay could not reach back (vLLM's buffer moved on)."
    )
    replay_error: str | None = None


def freshness_of(
    tracker: SequenceTracker | None,
    *,
    now: float,
    reachable: bool,
    replay_error: str | None = None,
) -> Freshness:
    """The report for a feed tracked by `tracker` (None: the instance has no feed)."""
    if tracker is None:
        return Freshness(state="no_feed")
    state: FeedState
    if not reachable:
        state = "unreachable"
    elif tracker.last_seq < 0 and not tracker.synced:
        state = "never_heard"
    elif replay_error is not None:
        state = "stale"
    elif not tracker.history_complete:
        state = "partial"
    else:
        state = "live"
    age = None if tracker.last_batch_ts is None else round(max(now - tracker.last_batch_ts, 0), 3)
    return Freshness(
        state=state,
        last_seq=tracker.last_seq if tracker.last_seq >= 0 else None,
        last_event_age_s=age,
        gaps=tracker.gaps,
        resets=tracker.resets,
        replays=tracker.replays,
        history_complete=tracker.history_complete,
        replay_error=replay_error,
    )
