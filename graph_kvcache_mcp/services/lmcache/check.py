"""`lmcache check`: validate the LMCache adapter against the engine without vLLM or LMCache.

Drives the same `EngineL2Client` that `lmcache server --l2-adapter` loads, exactly as LMCache's
adapter does: submit, wait on the eventfd, drain. Steps, each with pass/fail and figures:

1. `client`   — the client is built from the settings (URL, token) and exposes an eventfd.
2. `set`      — a random page under a fresh LMCache-style key completes ok.
3. `stored`   — engine stats grew: unique blocks +1 and logical bytes +page (memory backend), or
   `put_new` +1 (durable backend, which reports no occupancy).
4. `get`      — reading it back into a buffer of the page's size gives the same bytes.
5. `dedup`    — setting the same key again completes ok, the dedup counter moves and resident
   bytes stay flat (memory backend; the durable one has no byte figures).

Writes one page per run (the engine has no DELETE). Counters are deltas, so other writers to the
same engine during the run can disturb steps 3 and 5; the figures show by how much.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats, stats_delta
from graph_kvcache_mcp.domain.engine.limits import VALUE_CAP_BYTES
from graph_kvcache_mcp.domain.lmcache.keys import DEFAULT_NAMESPACE, engine_key
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.plugins.lmcache.l2 import EngineL2Client, wait_for_completion

DEFAULT_PAGE_BYTES = 256 * 1024
PageBytes = Annotated[int, Field(ge=1, le=VALUE_CAP_BYTES)]
"""Size of the random test page: one engine value at most."""


class CheckStep(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str = Field(description="client | set | stored | get | dedup")
    passed: bool
    detail: str
    figures: dict[str, Any] = Field(default_factory=dict)


class LmcacheCheckOut(BaseModel):
    """The adapter check: every step with pass/fail and figures."""

    model_config = ConfigDict(frozen=True)

    base_url: str
    reachable: bool
    passed: bool = Field(description="True when every step passed.")
    steps: list[CheckStep]
    backend: str | None = None
    lmcache_key: str | None = None
    engine_key: str | None = Field(None, description="Where the test page landed in the engine.")
    page_bytes: int = 0
    reason: str | None = Field(None, description="Why the check stopped early.")


def run_lmcache_check(
    base_url: str,
    token: SecretStr | None,
    *,
    page_bytes: int = DEFAULT_PAGE_BYTES,
    namespace: str = DEFAULT_NAMESPACE,
    timeout_s: float = 30.0,
) -> LmcacheCheckOut:
    """Run the steps in order against the engine at `base_url`; blocking (call it in a thread)."""
    client = EngineL2Client(
        base_url=base_url,
        token=token.get_secret_value() if token is not None else None,
        namespace=namespace,
        num_workers=1,
    )
    try:
        return _Check(client, page_bytes, timeout_s).run()
    finally:
        client.close()


class _Check:
    def __init__(self, client: EngineL2Client, page_bytes: int, timeout_s: float) -> None:
        self.client = client
        self.page_bytes = page_bytes
        self.timeout_s = timeout_s
        self.steps: list[CheckStep] = []
        self.key = f"graph-kvcache-mcp/check@00000000@0@{secrets.token_hex(32)}"
        self.page = secrets.token_bytes(page_bytes)

    def run(self) -> LmcacheCheckOut:
        base_url = self.client.core.base_url
        fd = self.client.event_fd()
        self.steps.append(
            CheckStep(
                name="client",
                passed=fd >= 0,
                detail=f"EngineL2Client for {base_url}, eventfd {fd}",
                figures={"num_workers": self.client.num_workers},
            )
        )
        before = self.client.core.engine_stats()
        if isinstance(before, Unavailable):
            return self._stop(base_url, before.reason, reachable=before.status is not None)
        set_ok = self._set("set", "first set of a random page")
        if not set_ok:
            return self._stop(base_url, self.steps[-1].detail, reachable=True, backend=before)
        after_set = self._stats()
        if after_set is None:
            return self._stop(base_url, self.steps[-1].detail, reachable=True, backend=before)
        self.steps.append(_stored_step(stats_delta(before, after_set), self.page_bytes))
        self._get()
        if self._set("dedup", "second set of the same key"):
            after_repeat = self._stats()
            if after_repeat is not None:
                self.steps[-1] = _dedup_step(stats_delta(after_set, after_repeat), self.steps[-1])
        return LmcacheCheckOut(
            base_url=base_url,
            reachable=True,
            passed=all(step.passed for step in self.steps),
            steps=self.steps,
            backend=before.backend,
            lmcache_key=self.key,
            engine_key=engine_key(self.key, namespace=self.client.namespace),
            page_bytes=self.page_bytes,
        )

    def _set(self, name: str, what: str) -> bool:
        started = time.perf_counter()
        future_id = self.client.submit_batch_set([self.key], [memoryview(self.page)])
        completion = wait_for_completion(self.client, future_id, timeout_s=self.timeout_s)
        elapsed_ms = round((time.perf_counter() - started) * 1000, 3)
        if completion is None:
            self.steps.append(
                CheckStep(name=name, passed=False, detail=f"{what}: no completion in time")
            )
            return False
        _, ok, error, _ = completion
        self.steps.append(
            CheckStep(
                name=name,
                passed=ok,
                detail=f"{what}: eventfd signalled, completion ok={ok}"
                + (f": {error}" if error else ""),
                figures={"future_id": future_id, "latency_ms": elapsed_ms},
            )
        )
        return ok

    def _get(self) -> None:
        buffer = bytearray(self.page_bytes)
        started = time.perf_counter()
        future_id = self.client.submit_batch_get([self.key], [memoryview(buffer)])
        completion = wait_for_completion(self.client, future_id, timeout_s=self.timeout_s)
        elapsed_ms = round((time.perf_counter() - started) * 1000, 3)
        if completion is None:
            self.steps.append(CheckStep(name="get", passed=False, detail="no completion in time"))
            return
        _, ok, error, loaded = completion
        exact = bytes(buffer) == self.page
        self.steps.append(
            CheckStep(
                name="get",
                passed=ok and loaded == [True] and exact,
                detail=("read back byte-exact" if exact else f"bytes differ or missing ({error})"),
                figures={
                    "latency_ms": elapsed_ms,
                    "loaded": loaded,
                    "sha256_sent": hashlib.sha256(self.page).hexdigest(),
                    "sha256_read": hashlib.sha256(buffer).hexdigest(),
                },
            )
        )

    def _stats(self) -> EngineStats | None:
        stats = self.client.core.engine_stats()
        if isinstance(stats, Unavailable):
            self.steps.append(
                CheckStep(name="stats", passed=False, detail=f"stats failed: {stats.reason}")
            )
            return None
        return stats

    def _stop(
        self,
        base_url: str,
        reason: str,
        *,
        reachable: bool,
        backend: EngineStats | None = None,
    ) -> LmcacheCheckOut:
        if not any(step.detail == reason for step in self.steps):
            self.steps.append(CheckStep(name="reachable", passed=False, detail=reason))
        return LmcacheCheckOut(
            base_url=base_url,
            reachable=reachable,
            passed=False,
            steps=self.steps,
            backend=backend.backend if backend else None,
            page_bytes=self.page_bytes,
            reason=reason,
        )


def _stored_step(moved: EngineStats, page_bytes: int) -> CheckStep:
    if moved.backend == "durable":
        passed = (moved.put_new or 0) >= 1
        figures: dict[str, Any] = {"put_new": moved.put_new}
        detail = f"durable backend: put_new moved by {moved.put_new}"
    else:
        passed = (moved.unique_blocks or 0) >= 1 and (moved.logical_bytes or 0) >= page_bytes
        figures = {
            "unique_blocks": moved.unique_blocks,
            "logical_bytes": moved.logical_bytes,
            "resident_bytes": moved.resident_bytes,
        }
        detail = (
            f"unique_blocks +{moved.unique_blocks}, logical_bytes +{moved.logical_bytes} "
            f"(page {page_bytes} bytes)"
        )
    return CheckStep(name="stored", passed=passed, detail=detail, figures=figures)


def _dedup_step(moved: EngineStats, set_step: CheckStep) -> CheckStep:
    figures = {**set_step.figures, "dedup_hits": moved.dedup_hits}
    passed = set_step.passed and (moved.dedup_hits or 0) >= 1
    detail = f"repeat set ok; dedup_hits +{moved.dedup_hits}"
    if moved.resident_bytes is not None:
        figures["resident_bytes"] = moved.resident_bytes
        passed = passed and moved.resident_bytes == 0
        detail += f", resident_bytes +{moved.resident_bytes} (must stay flat)"
    else:
        detail += " (durable backend reports no resident bytes)"
    return CheckStep(name="dedup", passed=passed, detail=detail, figures=figures)
