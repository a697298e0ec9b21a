"""A vLLM worker that died, read from the managed vLLM's log. Pure: the caller reads the lines.

vLLM's engine core logs `Worker proc VllmWorker-0 died unexpectedly (exit code: -4)` when a
worker process vanishes, then `EngineDeadError`, and the API server exits. The exit code is the
negated signal, or `None` when vLLM noticed the death before the process was reaped. The managed
vLLM runs with `PYTHONFAULTHANDLER=1`, so a worker killed by a fatal signal first dumps
`Fatal Python error: Illegal instruction` and the Python stack of the thread it died in: the top
frame of that thread names the library whose native code faulted. The last scheduler stats line
before the death says what the engine was doing.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

_DIED = re.compile(
    r"(?P<at>\d\d-\d\d \d\d:\d\d:\d\d) .*Worker proc (?P<worker>\S+) died unexpectedly "
    r"\(exit code: (?P<code>-?\d+|None)\)"
)
_FATAL = re.compile(r"^Fatal Python error: (?P<error>.+?)\s*$")
_CURRENT_THREAD = re.compile(r"^Current thread 0x[0-9a-f]+ \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_STATS = re.compile(r"(?P<at>\d\d-\d\d \d\d:\d\d:\d\d) .*Engine \d+: (?P<stats>Avg prompt .+)$")
_ENGINE_DEAD = ("EngineDeadError", "EngineCore encountered a fatal error")

# faulthandler's names for the fatal signals it catches (Modules/faulthandler.c).
_FAULT_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Floating-point exception": "SIGFPE",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Illegal instruction": "SIGILL",
}

ISSUE_41 = "docs/known-issues.md (worker killed by SIGILL under concurrent LMCache loads)"


class WorkerDeath(BaseModel):
    """How the managed vLLM's worker died, as its log tells it."""

    model_config = ConfigDict(frozen=True)

    worker: str = Field(description="vLLM's name for the worker process (VllmWorker-0).")
    exit_code: int | None = Field(description="Its exit code; negative: killed by that signal.")
    signal: str | None = Field(description="The signal that killed it (SIGILL), when known.")
    at: str = Field(description="When vLLM noticed, as its log writes it (MM-DD HH:MM:SS).")
    frame: str | None = Field(
        None, description="Where the worker was (its faulthandler dump's top frame)."
    )
    last_stats: str | None = Field(
        None, description="vLLM's last scheduler stats line before the death, with its time."
    )
    engine_dead: bool = Field(description="vLLM gave up its engine (EngineDeadError) after it.")
    what_happened: str
    what_to_do: str


def worker_death(lines: Sequence[str]) -> WorkerDeath | None:
    """The last worker death in `lines` (the log since the managed vLLM's last start), or None."""
    died_at = next((i for i in range(len(lines) - 1, -1, -1) if _DIED.search(lines[i])), None)
    if died_at is None:
        return None
    died = _DIED.search(lines[died_at])
    assert died is not None  # found above
    before = lines[:died_at]
    code = None if died["code"] == "None" else int(died["code"])
    fault = _last_fault(before)
    name = _signal_name(code) or (None if fault is None else _FAULT_SIGNALS.get(fault))
    frame = _faulting_frame(before) if fault is not None else None
    return WorkerDeath(
        worker=died["worker"],
        exit_code=code,
        signal=name,
        at=died["at"],
        frame=frame,
        last_stats=_last_stats(before),
        engine_dead=any(m in line for line in lines[died_at:] for m in _ENGINE_DEAD),
        what_happened=_what_happened(died["worker"], code, name, frame),
        what_to_do=_what_to_do(name),
    )


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return None


def _last_fault(lines: Sequence[str]) -> str | None:
    for line in reversed(lines):
        if found := _FATAL.match(line):
            return found["error"]
    return None


def _faulting_frame(lines: Sequence[str]) -> str | None:
    """The top frame of the thread faulthandler calls current in its last dump."""
    start = next(
        (i for i in range(len(lines) - 1, -1, -1) if _CURRENT_THREAD.match(lines[i])), None
    )
    if start is None or start + 1 >= len(lines):
        return None
    frame = _FRAME.match(lines[start + 1])
    if frame is None:
        return None
    path = frame["path"]
    # The part a reader recognises: the package path inside site-packages, else the file name.
    short = path.rsplit("site-packages/", 1)[1] if "site-packages/" in path else path
    if short == path:
        short = path.rsplit("/", 1)[-1]
    return f"{short}:{frame['line']} in {frame['func']}"


def _last_stats(lines: Sequence[str]) -> str | None:
    for line in reversed(lines):
        if found := _STATS.search(line):
            return f"{found['at']}: {found['stats']}"
    return None


def _what_happened(worker: str, code: int | None, name: str | None, frame: str | None) -> str:
    how = f"was killed by {name}" if name else f"exited (exit code {code})"
    where = f" in {frame}" if frame else ""
    return f"vLLM's worker {worker} {how}{where}; its engine is dead and vLLM stops serving"


def _what_to_do(name: str | None) -> str:
    restart = "start vLLM again (vllm_start; CLI: graph-kvcache-mcp vllm start)"
    if name == "SIGILL":
        return (
            f"{restart}. SIGILL is an illegal instruction or a compiler trap in native code; if it "
            f"recurs under concurrent LMCache loads, see {ISSUE_41} and report the frame, the "
            "CPU flags (lscpu) and the versions (diagnose_stack)"
        )
    if name == "SIGKILL":
        return (
            f"{restart}. SIGKILL without a stop is most often the kernel's OOM killer (dmesg "
            "says): free memory or lower --kv-cache-memory-bytes first"
        )
    if name in {"SIGSEGV", "SIGBUS", "SIGABRT", "SIGFPE"}:
        return f"{restart}; native code crashed: report the frame and versions (diagnose_stack)"
    return f"{restart}; vllm_logs shows the lines before the death"
