"""A graceful stop of a vLLM with EngineKVConnector waits for its queued saves (bounded, logged).

The engine sits behind a proxy that holds every PUT (a busy engine, `slow_writes_proxy`), so the
prompt's saves are still queued when vLLM is told to stop, right after answering.
"""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from graph_kvcache_mcp.domain.outcomes import Presence
from tests.support.engines import RunningEngine, running_engine
from tests.support.slow_writes import slow_writes_proxy
from tests.support.vllm_connector import connector_vllm, random_prompt

pytestmark = pytest.mark.vllm

PROMPT_TOKENS = 1200  # 37 full blocks of 32
HOLD_S = 0.25  # two upload lanes: about 4.6 s of saves still queued when the stop begins


def test_a_stop_right_after_a_request_waits_for_its_saves_and_a_new_vllm_loads_every_block(
    tmp_path: Path,
) -> None:
    prompt = random_prompt(PROMPT_TOKENS, seed=29)
    full_tokens = (PROMPT_TOKENS - 1) // 32 * 32
    with running_engine(tmp_path / "engine", "memory") as engine:
        port = urlsplit(engine.base_url).port
        assert port is not None
        with (
            slow_writes_proxy(port, hold_s=HOLD_S) as proxy,
            connector_vllm(
                tmp_path / "first", engine, extra_env={"EPISTEMIC_GRAPH_KVCACHE_URL": proxy}
            ) as first,
        ):
            first.complete(prompt, max_tokens=1)
            began = time.monotonic()
            stopped = first.managed.stop()
            took = time.monotonic() - began
            keys = first.keys_of(prompt)[: full_tokens // 32]
            log = first.log_text()
        said = [line for line in log.splitlines() if "stopping" in line or "saves" in line]
        assert stopped.how == "terminated", (stopped, took, said)
        assert any("EngineKVConnector: stopping; waiting up to 10 s for" in x for x in said), said
        assert any("the saves were answered in" in line for line in said), (took, said)
        _assert_stored(engine, keys)
        with connector_vllm(tmp_path / "second", engine) as second:
            hits_before = second.external_hits()
            warm = second.complete(prompt, max_tokens=1)
            assert (warm.cached_tokens, second.external_hits() - hits_before) == (
                full_tokens,
                full_tokens,
            )


def _assert_stored(engine: RunningEngine, keys: list[str]) -> None:
    with engine.sync_client() as client:
        present = client.contains_many(keys)
    missing = [index for index, answer in enumerate(present) if answer != Presence(True)]
    assert not missing, f"blocks {missing} of {len(keys)} are not in the engine"
