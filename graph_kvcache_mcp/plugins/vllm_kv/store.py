"""The engine as seen from inside vLLM: bounded, never-raising block lookups, reads and writes.

Used by the vLLM KV connector (`plugins.vllm_kv.connector`), which runs in vLLM's processes:
every call here answers within the KV timeout (`EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S`, whole batch
included) and turns "engine down, slow or garbled" into a miss, so vLLM recomputes instead of
failing. After a failure the store stays quiet for a while (`engine_calls.OutagePause`). Reads
live here; writes are the background queue of `plugins.vllm_kv.uploads`, which this store owns.

Imports only the standard library and the package's wire client, which vLLM's own venv provides.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.children.proof import engine_proof
from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.engine.http_response import BodySink
from graph_kvcache_mcp.domain.endpoints import DEFAULT_KV_HOST, DEFAULT_KV_PORT
from graph_kvcache_mcp.domain.outcomes import Hit, Outcome, Presence, Unavailable
from graph_kvcache_mcp.domain.vllm.engine_kv.device import every_rank_keys
from graph_kvcache_mcp.domain.vllm.engine_kv.hit_sources import HitSource, engine_hit_source
from graph_kvcache_mcp.plugins.vllm_kv.engine_calls import OutagePause, TransferTally
from graph_kvcache_mcp.plugins.vllm_kv.uploads import (
    Encode,
    Payload,
    UploadQueue,
    bind_calling_thread,
)

LOOKUP_CHUNK = 16
"""Existence checks per round: a cold prompt costs one round, not one per block."""


class EngineBlockStore:
    """Block reads and writes against one engine, bounded in time and never raising."""

    def __init__(
        self,
        client: SyncKvClient,
        *,
        timeout_s: float,
        concurrency: int,
        tally: TransferTally | None = None,
    ) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="engine-kv")
        self._pause = OutagePause(timeout_s)
        self.tally = tally or TransferTally()
        self.uploads = UploadQueue(client, self._pause, self.tally)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> EngineBlockStore:
        """The engine named by `EPISTEMIC_GRAPH_KVCACHE_URL` (or `_ADDR`), else 127.0.0.1:9130.

        Raises:
            ConfigError: a malformed URL, token or timeout in the environment.
        """
        settings = Settings.from_env(environ)
        url = settings.kv_url or f"http://{DEFAULT_KV_HOST}:{DEFAULT_KV_PORT}"
        client = SyncKvClient(
            url, settings.kv_token, timeout_s=settings.kv_timeout_s, proof=engine_proof(environ)
        )
        return cls(client, timeout_s=settings.kv_timeout_s, concurrency=settings.kv_concurrency)

    def __repr__(self) -> str:
        return f"EngineBlockStore({self.client.base_url!r})"

    # --- reads -------------------------------------------------------------------------------

    def count_present(self, keys: Sequence[str], *, ranks: int = 1) -> int:
        """How many of the blocks `keys` name, from the first, the engine holds (0 when it
        cannot answer). With `ranks` tensor-parallel ranks a block counts only when every
        rank's key is held (`every_rank_keys`): the run stops at the first block any rank
        misses. One rank asks for `keys` themselves."""
        return self._leading_run(every_rank_keys(keys, ranks)) // ranks

    def _leading_run(self, keys: Sequence[str]) -> int:
        """How many of `keys`, from the first, the engine holds (0 when it cannot answer)."""
        deadline = time.monotonic() + self.timeout_s
        found = 0
        for start in range(0, len(keys), LOOKUP_CHUNK):
            chunk = keys[start : start + LOOKUP_CHUNK]
            answers = self._pause.run_all(
                self._pool, self.client.contains, chunk, deadline, "lookup"
            )
            for answer in answers:
                if not (isinstance(answer, Presence) and answer.present):
                    return found
                found += 1
        return found

    def first_present(self, keys: Sequence[str]) -> int | None:
        """The index of the first of `keys` the engine holds (None when none, or no answer)."""
        deadline = time.monotonic() + self.timeout_s
        for start in range(0, len(keys), LOOKUP_CHUNK):
            chunk = keys[start : start + LOOKUP_CHUNK]
            answers = self._pause.run_all(
                self._pool, self.client.contains, chunk, deadline, "lookup"
            )
            for offset, answer in enumerate(answers):
                if answer is None or isinstance(answer, Unavailable):
                    return None
                if isinstance(answer, Presence) and answer.present:
                    return start + offset
        return None

    def hit_source(self) -> HitSource | None:
        """The cache tier this engine's hits count under in vLLM's metrics, or None when the
        engine did not say its backend (down, paused, or an answer without one)."""
        if self._pause.quiet():
            return None
        try:
            stats = self.client.engine_stats()
        except Exception:  # never into vLLM
            return None
        if isinstance(stats, Unavailable) or stats.backend == "unknown":
            return None
        return engine_hit_source(stats.backend, engine_on_loopback=self.client.endpoint.is_loopback)

    def fetch(self, keys: Sequence[str]) -> list[bytes | None]:
        """The stored values of `keys`, None for each one missing or not read in time."""
        deadline = time.monotonic() + self.timeout_s
        answers = self._pause.run_all(self._pool, self.client.get, keys, deadline, "load")
        return [answer.value if isinstance(answer, Hit) else None for answer in answers]

    def fetch_into(
        self, keys: Sequence[str], sinks: Sequence[BodySink], *, expect_bytes: int = 0
    ) -> list[Outcome[int]]:
        """Each key's value received straight into its sink, on up to `concurrency` lanes, the
        whole batch within the KV timeout (longer by `expect_bytes`, the values' size, as the
        client's puts are: a long prompt's load on a busy box is not cut off mid-way);
        `Hit(bytes received)` where the engine had it.

        After an answer that is `Unavailable` (a timeout among them), a lane may still be
        writing into its sink's buffer for a moment: hand that buffer out again only after a
        batch without one.
        """
        if not keys or self._pause.quiet():
            return [Unavailable("engine calls paused after a failure")] * len(keys)
        try:
            answers = self.client.get_many_into(keys, sinks, expect_bytes=expect_bytes)
        except Exception as exc:  # never into vLLM; InvalidKey cannot happen for our keys
            self._pause.went_wrong("load", f"the client raised {type(exc).__name__}")
            return [Unavailable("the client raised")] * len(keys)
        if failure := next((a for a in answers if isinstance(a, Unavailable)), None):
            self._pause.went_wrong("load", failure.reason)
        return answers

    def run_loads_on(self, cores: frozenset[int]) -> None:
        """Let the client's batch lanes run on `cores` (set before the first load).

        vLLM's CPU worker binds its main thread to the OpenMP cores, and every thread it starts
        later inherits that: the load lanes ran on the forward pass's cores only, while the
        forward pass itself waits for the load and vLLM's reserved cores sat beside them.
        """
        self.client.lane_setup = partial(bind_calling_thread, cores)

    # --- writes (the upload queue's) ---------------------------------------------------------

    def save_later(
        self, items: Sequence[tuple[str, Payload]], encode: Encode | None = None
    ) -> None:
        """Queue (key, value) pairs for upload (`UploadQueue.save_later`)."""
        self.uploads.save_later(items, encode)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued block was sent (or dropped); False when time ran out."""
        return self.uploads.flush(timeout_s)

    def pending(self) -> tuple[int, int]:
        """Blocks and bytes queued or being uploaded, not yet answered by the engine."""
        return self.uploads.pending()

    def drain(self, timeout_s: float) -> None:
        """A graceful stop's bounded wait for the queued saves (`UploadQueue.drain`)."""
        self.uploads.drain(timeout_s)

    def close(self, *, flush_timeout_s: float = 5.0) -> None:
        self.uploads.close(flush_timeout_s)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
