"""Requests whose blocks vLLM must not free yet: their async saves may still be reading them.

A save's copy out of the KV cache runs on a side stream after the step that queued it: once a
request finishes, vLLM would free its blocks and the next step could write them before the copy
has read them. So with async saves the scheduler side answers `request_finished` with True for
every request it planned a save for (`SchedulerHolds`), and the worker side names that request in
`finished_sending` once all its copies are done (`HeldSaves`); vLLM frees the blocks then. Both
sides keep the same rule ("a save was ever planned for it"), so every held request is released.
"""

from __future__ import annotations

from collections.abc import Iterable

from graph_kvcache_mcp.plugins.vllm_kv.device.streams import Fence


class SchedulerHolds:
    """The scheduler side's half: which finished requests vLLM must keep the blocks of."""

    def __init__(self, async_saves: bool) -> None:
        self.async_saves = async_saves
        self._saving: set[str] = set()

    def planned(self, req_ids: Iterable[str]) -> None:
        """This step plans saves for `req_ids`."""
        if self.async_saves:
            self._saving.update(req_ids)

    def finished(self, req_id: str) -> bool:
        """`request_finished`'s answer: True when the worker will report the request's saves."""
        if req_id in self._saving:
            self._saving.discard(req_id)
            return True
        return False


class HeldSaves:
    """The worker side's half: the fences of each request's saves, and who may be released."""

    def __init__(self) -> None:
        self._saved: set[str] = set()
        self._fences: dict[str, list[Fence]] = {}

    def saving(self, req_id: str, fence: Fence) -> None:
        """A save of `req_id`'s blocks is queued; its copy is done at `fence`."""
        self._saved.add(req_id)
        pending = [done for done in self._fences.get(req_id, []) if not done.query()]
        self._fences[req_id] = [*pending, fence]

    def release(self, finished: Iterable[str]) -> set[str]:
        """Of the requests vLLM finished, those it held for a save, once their copies are done.

        Waits here for copies still running (a copy of a few blocks, queued a step ago): a held
        request must be released in this answer, as vLLM may take no further step to ask again.
        """
        released = set()
        for req_id in finished:
            if req_id not in self._saved:
                continue
            for fence in self._fences.pop(req_id, []):
                fence.synchronize()
            self._saved.discard(req_id)
            released.add(req_id)
        return released

    def wait_all(self) -> None:
        """Every copy queued so far is done (vLLM is about to free preempted requests' blocks)."""
        for fences in self._fences.values():
            for fence in fences:
                fence.synchronize()
            fences.clear()

    def in_flight(self) -> int:
        """Copies not known to be done."""
        return sum(not fence.query() for fences in self._fences.values() for fence in fences)
