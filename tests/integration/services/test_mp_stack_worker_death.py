"""Issue #41 on the MP stack (vLLM -> lmcache server -> engine, every process real):

- after a vLLM restart, vLLM's own benchmark client sends 4 requests at once whose prefixes sit in
  LMCache's L1, so LMCache loads four requests concurrently into the new vLLM: vLLM stays up and
  its counters account for every prompt token;
- a worker killed by SIGILL (through its pid: a child of the vLLM we started) is a finding:
  vllm_status, diagnose_stack and vllm_chat say the engine died, how, and what to do.

vLLM starts: 1 (the stack) + 1 (the restart). The kill runs last: it ends the stack's vLLM.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from mcp import Client

from graph_kvcache_mcp.connectors.vllm.health import read_worker_death
from graph_kvcache_mcp.domain.diagnosis.stack_facts import StackDiagnosis
from graph_kvcache_mcp.domain.vllm.worker_death import WorkerDeath
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.vllm.views import VllmChatOut, VllmStatusOut
from tests.support.mcp_calls import call_ok
from tests.support.mp_stack import CHUNK_SIZE, MpStack, module_stack
from tests.support.vllm import READY_TIMEOUT_S

pytestmark = [pytest.mark.vllm, pytest.mark.lmcache]

PREFIXES = 4
PREFIX_LEN = 1400  # ~1.5k-token prompts, as in the issue
SUFFIX_LEN = 100
CONCURRENCY = 4
DEATH_WAIT_S = 120.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MpStack]:
    yield from module_stack(tmp_path_factory.mktemp("mp-worker-death"))


def bench(stack: MpStack, out: Path) -> dict[str, Any]:
    """16 prompts over 4 shared ~1.4k-token prefixes, 4 at a time, the same prompts each run."""
    return stack.bench(
        out,
        prefixes=PREFIXES,
        prefix_len=PREFIX_LEN,
        suffix_len=SUFFIX_LEN,
        concurrency=CONCURRENCY,
        seed=41,
    )


async def test_concurrent_lmcache_loads_after_a_restart_keep_vllm_up_and_count_every_token(
    stack: MpStack, tmp_path: Path
) -> None:
    await stack.ensure()
    bench(stack, tmp_path / "cold")  # LMCache stores every prefix in L1
    stack.vllm.restart(env=stack.env, ready_timeout_s=READY_TIMEOUT_S)
    before = stack.vllm_counters()
    assert (before.prompt_tokens or 0) == 0  # a new process: nothing cached locally
    result = bench(stack, tmp_path / "after-restart")
    after = stack.vllm_counters()

    assert stack.healthy()
    assert read_worker_death(stack.vllm.log_path) is None
    prompt = (after.prompt_tokens or 0) - (before.prompt_tokens or 0)
    assert prompt == result["total_input_tokens"]
    # Every prompt token is either computed, found in vLLM's own cache or loaded from LMCache.
    sources = after.prompt_tokens_by_source or {}
    assert sum(sources.values()) == prompt, sources
    external = (after.external_prefix_cache_hits_tokens or 0) - (
        before.external_prefix_cache_hits_tokens or 0
    )
    assert sources.get("external_kv_transfer", 0) == external
    # The first four requests (one per prefix) loaded their prefix's whole chunks from LMCache.
    assert external >= PREFIXES * (PREFIX_LEN // CHUNK_SIZE) * CHUNK_SIZE, sources


async def test_a_worker_killed_by_sigill_is_a_finding_for_status_diagnosis_and_chat(
    stack: MpStack,
) -> None:
    await stack.ensure()
    state = stack.vllm.running_state()
    assert state is not None
    workers = [
        child
        for child in psutil.Process(state.process.pid).children(recursive=True)
        if "VLLM::Worker" in child.name() or "VLLM::Worker" in " ".join(child.cmdline())
    ]
    assert len(workers) == 1, workers
    os.kill(workers[0].pid, signal.SIGILL)  # our own vLLM's worker, as the died
    death = wait_for_death(stack)

    assert (death.signal, death.exit_code) in {("SIGILL", -4), ("SIGILL", None)}
    assert death.worker == "VllmWorker-0" and death.frame is not None  # faulthandler's dump
    settings = stack.settings.model_copy(update={"toolsets": ("vllm", "diagnose")})
    async with Client(build_server(settings)) as client:
        status = VllmStatusOut.model_validate(await call_ok(client, "vllm_status", {}))
        chat = VllmChatOut.model_validate(
            await call_ok(client, "vllm_chat", {"message": "hello", "max_tokens": 1})
        )
        diagnosis = StackDiagnosis.model_validate(await call_ok(client, "diagnose_stack", {}))
    assert not status.reachable
    assert status.worker_death is not None and status.worker_death.signal == "SIGILL"
    assert status.reason is not None and status.reason.startswith("the engine died: ")
    assert not chat.reachable
    assert chat.reason is not None and "the engine died: " in chat.reason
    assert "killed by SIGILL" in chat.reason
    died = [f for f in diagnosis.findings if f.id == "vllm_worker_died"]
    assert len(died) == 1 and died[0].severity == "error", diagnosis.findings
    assert "killed by SIGILL" in died[0].evidence and "vllm_start" in died[0].fix


def wait_for_death(stack: MpStack) -> WorkerDeath:
    """The death once vLLM has logged it and given up its engine (a bound, not a race)."""
    deadline = time.monotonic() + DEATH_WAIT_S
    while time.monotonic() < deadline:
        death = read_worker_death(stack.vllm.log_path)
        if death is not None and death.engine_dead:
            return death
        time.sleep(0.5)
    raise AssertionError(f"no worker death in {stack.vllm.log_path} after {DEATH_WAIT_S} s")
