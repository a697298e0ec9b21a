"""The design's stack for tests and benches: a real engine, a real managed `lmcache server` (from
.venv-lmcache) with either L2 adapter, and real CPU vLLMs with LMCache's MP connector.

- `resp_server` / `native_server`: the generator's `redis_resp` / `mp_native` server for a CPU
  vLLM (small L1), started by the project's own lifecycle code and stopped when the block exits.
- `mp_vllm`: a vLLM whose KV connector is `LMCacheMPConnector` to such a server (vLLM's venv must
  hold lmcache).
- `MpVllm.complete`: a greedy token-id completion with logprobs (`vllm_connector.complete`), so
  a test compares restored KV with the cold run's.
"""

from __future__ import annotations

import re
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.stack.resp import start_resp_lmcache
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmStatus
from graph_kvcache_mcp.domain.lmcache.config import LmcacheChoices, Mode, ProcessSpec, plan_lmcache
from graph_kvcache_mcp.domain.lmcache.model import ModelFacts
from tests.support.engines import RunningEngine
from tests.support.lmcache import require_lmcache
from tests.support.mp_stack import require_lmcache_in_vllm_venv
from tests.support.vllm import (
    BLOCK_SIZE,
    READY_TIMEOUT_S,
    VLLM_CPU,
    fast_cpu_launch,
    offline_environment,
    tiny_model_dir,
)
from tests.support.vllm_connector import Completion, complete

CHUNK_TOKENS = 64
SERVER_READY_S = 240.0


@dataclass(frozen=True)
class StackServer:
    managed: ManagedLmcache
    status: LmcacheStatus
    port: int

    @property
    def http_url(self) -> str:
        assert self.status.http_url is not None
        return self.status.http_url

    def counter(self, name: str) -> float:
        """One counter of the server's `/metrics` (summed over its labels; 0 when absent)."""
        with urllib.request.urlopen(self.http_url + "/metrics", timeout=10) as response:
            text = response.read().decode()
        pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", re.MULTILINE)
        return sum(float(value) for value in pattern.findall(text))

    def wait_counter(self, name: str, *, at_least: float, timeout_s: float = 120.0) -> float:
        """Poll a counter until it reaches `at_least` (L2 stores finish after vLLM answers)."""
        deadline = time.monotonic() + timeout_s
        while (value := self.counter(name)) < at_least:
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} stayed at {value} (wanted >= {at_least})")
            time.sleep(0.2)
        return value


def server_plan(
    facts: ModelFacts, mode: Mode, engine_url: str, *, port: int, chunk_tokens: int = CHUNK_TOKENS
) -> ProcessSpec:
    plan = plan_lmcache(
        facts,
        LmcacheChoices(
            mode=mode,
            engine_url=engine_url,
            chunk_size=chunk_tokens,
            lmcache_port=port,
            lmcache_http_port=free_port(),
            l1_size_gb=0.25,
            num_workers=2,
            vllm_block_size=BLOCK_SIZE,
            cpu=True,  # the shared-memory transfer path a CPU worker registers with
        ),
    )
    assert plan.lmcache_server is not None
    return plan.lmcache_server


@contextmanager
def resp_server(data_dir: Path, engine: RunningEngine, facts: ModelFacts) -> Iterator[StackServer]:
    """A `redis_resp` server on `engine`'s RESP wire (which must answer)."""
    managed = ManagedLmcache(data_dir, python=require_lmcache().with_name("python"))
    port = free_port()
    server = server_plan(facts, "redis_resp", engine.base_url, port=port)
    try:
        status = start_resp_lmcache(
            engine.managed, managed, server, env=_telemetry_off(), ready_timeout_s=SERVER_READY_S
        )
        yield StackServer(managed, status, port)
    finally:
        managed.stop(term_wait_s=15.0)


@contextmanager
def native_server(
    data_dir: Path, engine: RunningEngine, facts: ModelFacts, *, chunk_tokens: int = CHUNK_TOKENS
) -> Iterator[StackServer]:
    """An `mp_native` server whose L2 is our adapter on `engine`'s `/kv`."""
    managed = ManagedLmcache(data_dir, python=require_lmcache().with_name("python"))
    port = free_port()
    server = server_plan(facts, "mp_native", engine.base_url, port=port, chunk_tokens=chunk_tokens)
    env = {**_telemetry_off(), "EPISTEMIC_GRAPH_KVCACHE_TOKEN": engine.token.get_secret_value()}
    try:
        status = managed.start(server, env=env, ready_timeout_s=SERVER_READY_S)
        yield StackServer(managed, status, port)
    finally:
        managed.stop(term_wait_s=15.0)


def _telemetry_off() -> dict[str, str]:
    return {"PYTHONHASHSEED": "0", "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1"}


@dataclass(frozen=True)
class MpVllm:
    managed: ManagedVllm
    status: VllmStatus

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.status.port}"

    def complete(self, token_ids: Sequence[int], *, max_tokens: int = 4) -> Completion:
        """Greedy completion of a token-id prompt with each generated token's logprob."""
        return complete(self.root_url, token_ids, max_tokens=max_tokens)


@contextmanager
def mp_vllm(
    data_dir: Path,
    server: StackServer,
    *,
    kv_connector: str,
    model_dir: Path | None = None,
    **launch_overrides: object,
) -> Iterator[MpVllm]:
    """A vLLM with LMCache's MP connector (`kv_connector` mp_native or redis_resp: the same on
    vLLM's side) to `server`, stopped when the block exits."""
    managed = ManagedVllm(data_dir, python=require_lmcache_in_vllm_venv())
    values: dict[str, object] = {"kv_connector": kv_connector, "lmcache_port": server.port}
    if (server.status.rpc_url or "").startswith("ipc://"):  # a managed server: its private socket
        values["lmcache_rpc_url"] = server.status.rpc_url
    values.update(launch_overrides)
    launch = fast_cpu_launch(model_dir or tiny_model_dir(), free_port(), **values)
    with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache_root:
        env = {**offline_environment(Path(cache_root)), "GLOO_SOCKET_IFNAME": "lo"}
        try:
            status = managed.start(
                launch, env=env, ready_timeout_s=READY_TIMEOUT_S, platform=VLLM_CPU
            )
            yield MpVllm(managed, status)
        finally:
            managed.stop(term_wait_s=30.0)
