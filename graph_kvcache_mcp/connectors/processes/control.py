"""Starting and stopping the processes we manage: spawn into a private log, stop in stages.

A child starts in its own session (so it can be stopped as a group) with exactly the environment
its manager gives it and umask 077. Stopping sends SIGTERM, waits, then SIGKILL, and only to a
process that is still the one we started (`identity.is_ours`).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Literal, TypeAlias

from graph_kvcache_mcp.connectors.files.private import open_private_log
from graph_kvcache_mcp.connectors.processes.identity import (
    NONCE_VARIABLE,
    ProcessRecord,
    group_members,
    is_ours,
    is_zombie,
    start_ticks,
)
from graph_kvcache_mcp.domain.plain_text import plain_text

CHILD_UMASK = 0o077
StopHow: TypeAlias = Literal["terminated", "killed", "not_running"]


# What every child process may inherit from us, whatever it is: the OS basics its runtime needs.
OS_INHERITED = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR"})
OS_INHERITED_PREFIXES = ("LC_",)

# What an ML runtime we start (vLLM, `lmcache server`) may inherit from us: the OS basics, and the
# families of variables vLLM, LMCache and their stack
# (torch, CUDA, Hugging Face, LMCache, the CPU backend's preloads) read. Our own secrets (the
# engine token, the HTTP token, the bundle secret) match none of them. VLLM_API_KEY passes: it is
# the key set for vLLM itself, which the vllm_* tools send as well. The CA settings pass too:
# a child that talks https to the engine (the lmcache server's L2 adapter, vLLM with our
# connector) trusts a private CA (a fleet's) only through them, as our own clients do. Our
# clients (stdlib `ssl`, httpx2) read SSL_CERT_FILE and SSL_CERT_DIR, nothing else
# (REQUESTS_CA_BUNDLE is the `requests` library's, which no engine client uses).
TLS_TRUST_INHERITED = frozenset({"SSL_CERT_FILE", "SSL_CERT_DIR"})
ML_STACK_INHERITED = (
    OS_INHERITED
    | TLS_TRUST_INHERITED
    | frozenset(
        {
            "LD_LIBRARY_PATH",
            "LD_PRELOAD",
            "PYTHONPATH",
            "VIRTUAL_ENV",
            "XDG_CACHE_HOME",
            "TOKENIZERS_PARALLELISM",
            "CC",
            "CXX",
        }
    )
)
ML_STACK_INHERITED_PREFIXES = (
    *OS_INHERITED_PREFIXES,
    "VLLM_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "HF_",
    "TRANSFORMERS_",
    "TORCH",
    "PYTORCH_",
    "TRITON_",
    "OMP_",
    "MKL_",
    "KMP_",
    "LMCACHE_",
)


def inherited_environment(names: Collection[str], prefixes: tuple[str, ...]) -> dict[str, str]:
    """The part of this process's environment a child may see: `names` and `prefixes` only, so
    no secret of ours reaches it by accident."""
    return {
        name: value
        for name, value in os.environ.items()
        if name in names or name.startswith(prefixes)
    }


def spawn_logged(
    command: tuple[str, ...],
    *,
    env: Mapping[str, str],
    log_path: Path,
    header: str | None = None,
) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Start `command` in its own session (so it can be stopped as a group) with stdout and
    stderr appended to `log_path` (0600, after `header`, when given); returns it and its record.

    The child gets exactly `env` plus a fresh nonce (`NONCE_VARIABLE`, kept in the record too:
    `is_ours` matches the two) and umask 077, so what it writes (its store, its own logs) is
    private too.
    """
    nonce = secrets.token_hex(16)
    with open_private_log(log_path) as log:
        if header is not None:
            log.write(header.encode())
            log.flush()
        process = subprocess.Popen(
            command,
            env={**env, NONCE_VARIABLE: nonce},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            umask=CHILD_UMASK,
        )
    ticks = start_ticks(process.pid)
    record = ProcessRecord(
        pid=process.pid,
        start_ticks=ticks if ticks is not None else -1,
        command=command,
        started_at=time.time(),
        log_path=str(log_path),
        nonce=nonce,
    )
    return process, record


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait until `pid` exits (reaping it when it is our child); True when it is gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return True
            our_child = True
        except OSError:  # ChildProcessError: not our child (Windows: not a handle of ours)
            our_child = False
        if start_ticks(pid) is None:
            return True
        # A zombie that is not our child is as gone as we can see. Our own child is gone once
        # reaped: its leader thread shows as a zombie while the other threads still exit, and
        # waitpid cannot reap it until they have.
        if not our_child and is_zombie(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop_process(record: ProcessRecord, *, term_wait_s: float, kill_wait_s: float = 5.0) -> StopHow:
    """SIGTERM, wait, then SIGKILL — only when `record` is still ours. Returns what happened.

    Signals the whole process group when the process leads one (we start children in their own
    session), so helpers it spawned go too.
    """
    if not is_ours(record):
        return "not_running"
    # Windows has no process groups (nor SIGKILL): there the process alone is signalled.
    target_group = hasattr(os, "killpg") and os.getpgid(record.pid) == record.pid

    def send(sig: signal.Signals) -> None:
        try:
            if target_group:
                os.killpg(record.pid, sig)
            else:
                os.kill(record.pid, sig)
        except ProcessLookupError:
            pass

    send(signal.SIGTERM)
    if wait_gone(record.pid, term_wait_s):
        return "terminated"
    send(getattr(signal, "SIGKILL", signal.SIGTERM))
    wait_gone(record.pid, kill_wait_s)
    return "killed"


def reap_group(pgid: int, *, wait_s: float) -> list[int]:
    """Wait for the rest of our group to exit; SIGKILL what is left. Returns any survivors.

    Safe to signal: a process group id cannot be reused while any member of the group lives,
    and this group was created by our `start_new_session`.
    """
    deadline = time.monotonic() + wait_s
    while (members := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if members:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return []
        kill_deadline = time.monotonic() + 5.0
        while (members := group_members(pgid)) and time.monotonic() < kill_deadline:
            time.sleep(0.05)
    return members


def tail(path: Path, lines: int = 20, *, max_bytes: int = 64 * 1024) -> str:
    """The last `lines` lines of a log file as plain text, without terminal escapes ('' when it
    does not exist): what callers quote ends up in reasons."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            text = plain_text(handle.read().decode(errors="replace"))
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
