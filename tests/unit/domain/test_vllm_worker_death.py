"""A dead vLLM worker read from real log lines (captured from a CPU vLLM whose worker was killed
with SIGILL; the faulthandler dump trimmed to the frames read, paths made neutral)."""

from __future__ import annotations

from pathlib import Path

from graph_kvcache_mcp.domain.diagnosis.stack_findings import VllmFacts, stack_findings
from graph_kvcache_mcp.domain.vllm.worker_death import ISSUE_41, worker_death

DATA = Path(__file__).parent / "data"
SIGILL_LOG = (DATA / "vllm_worker_sigill.log").read_text().splitlines()
UNREAPED_LOG = (DATA / "vllm_worker_died_unreaped.log").read_text().splitlines()


def test_a_worker_killed_by_sigill_names_the_signal_time_frame_and_last_stats() -> None:
    death = worker_death(SIGILL_LOG)
    assert death is not None
    assert (death.worker, death.exit_code, death.signal) == ("VllmWorker-0", -4, "SIGILL")
    assert death.at == "12-05 18:51:04"
    # The current thread of faulthandler's dump, not the first thread it lists.
    assert death.frame == "zmq/sugar/poll.py:106 in poll"
    assert death.last_stats is not None
    assert death.last_stats.startswith("12-05 18:50:57: Avg prompt throughput: 237.6 tokens/s")
    assert "Running: 0 reqs" in death.last_stats
    assert death.engine_dead
    assert "VllmWorker-0 was killed by SIGILL in zmq/sugar/poll.py:106" in death.what_happened
    assert "vllm_start" in death.what_to_do and ISSUE_41 in death.what_to_do


def test_a_death_vllm_saw_before_the_reaping_takes_its_signal_from_the_dump() -> None:
    dump = [line for line in SIGILL_LOG if "died unexpectedly" not in line]
    death = worker_death([*dump[:26], *UNREAPED_LOG])
    assert death is not None
    assert (death.exit_code, death.signal) == (None, "SIGILL")
    assert not death.engine_dead  # the lines after the death are not there


def test_without_a_dump_or_a_signal_the_exit_code_is_all_it_says() -> None:
    death = worker_death(UNREAPED_LOG)
    assert death is not None
    assert (death.exit_code, death.signal, death.frame, death.last_stats) == (
        None,
        None,
        None,
        None,
    )
    assert "exited (exit code None)" in death.what_happened
    assert "vllm_logs" in death.what_to_do


def test_a_worker_killed_by_sigkill_points_at_the_oom_killer() -> None:
    lines = [line.replace("exit code: -4", "exit code: -9") for line in SIGILL_LOG]
    lines = [line for line in lines if not line.startswith("Fatal Python error")]
    death = worker_death(lines)
    assert death is not None
    assert (death.signal, death.frame) == ("SIGKILL", None)  # no dump: no frame guessed
    assert "OOM killer" in death.what_to_do


def test_a_log_without_a_death_has_none() -> None:
    healthy = [line for line in SIGILL_LOG if "died unexpectedly" not in line]
    assert worker_death(healthy) is None
    assert worker_death([]) is None


def test_diagnosis_puts_the_worker_death_before_the_unreachable_server() -> None:
    death = worker_death(SIGILL_LOG)
    facts = VllmFacts(
        target="http://127.0.0.1:8000/v1",
        reachable=False,
        reason="no answer from http://127.0.0.1:8000 (ConnectError)",
        worker_death=death,
    )
    findings = stack_findings(None, facts, None).findings
    assert [f.id for f in findings] == ["vllm_worker_died", "vllm_unreachable"]
    died = findings[0]
    assert died.severity == "error"
    assert "killed by SIGILL" in died.evidence and "exit code -4" in died.evidence
    assert "last scheduler stats 12-05 18:50:57: Avg prompt throughput" in died.evidence
    assert death is not None and died.fix == death.what_to_do
