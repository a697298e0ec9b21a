"""EngineKVConnector as a hybrid model's KV tier, in real CPU vLLM processes on a real engine.

Tiny random Mamba2 hybrids (`tests/support/hybrid.py`): GraniteMoeHybrid (two KV cache groups)
and NemotronH (three). A prompt computed by one vLLM comes back from the engine after a restart
and in a second vLLM: every full block counted by vLLM as an external hit, and the answer's
logprobs equal to a cold run on a vLLM without the connector.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path

import pytest

from graph_kvcache_mcp.domain.outcomes import Presence
from graph_kvcache_mcp.domain.vllm.kv_blocks import block_digests, chain_root, state_key
from tests.support.engines import RunningEngine, running_engine
from tests.support.hybrid import HYBRID_BLOCK, hybrid_model_dir, hybrid_recipe
from tests.support.processes import wait_until
from tests.support.vllm import READY_TIMEOUT_S
from tests.support.vllm_connector import (
    Completion,
    ConnectorVllm,
    connector_environment,
    connector_vllm,
    random_prompt,
)

pytestmark = pytest.mark.vllm

PROMPT_TOKENS = 2500
_STATE_IDENTITY = re.compile(r"state identity ([0-9a-f]{64})")


@pytest.fixture(scope="module")
def kv_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    with running_engine(tmp_path_factory.mktemp("hybrid-engine"), "memory") as engine:
        yield engine


def _stored_keys(server: ConnectorVllm, prompt: list[int]) -> list[str]:
    """The prompt's attention block keys and the key of the Mamba state at their end."""
    match = _STATE_IDENTITY.search(server.log_text())
    assert match, "no hybrid line in vLLM's log"
    digests = block_digests(chain_root(server.identity_digest()), prompt, server.block_size)
    full = (len(prompt) - 1) // server.block_size
    return [*server.keys_of(prompt)[:full], state_key(match.group(1), digests[full - 1])]


def _wait_stored(engine: RunningEngine, keys: list[str]) -> None:
    with engine.sync_client() as client:
        wait_until(
            lambda: all(p == Presence(True) for p in client.contains_many(keys)),
            timeout_s=60.0,
            what=f"{len(keys)} blocks and states in the engine",
        )


def _start_together(
    stack: ExitStack, starts: list[Callable[[], AbstractContextManager[ConnectorVllm]]]
) -> list[ConnectorVllm]:
    """Start several vLLMs at once (a start mostly waits on vLLM's own processes)."""
    managers = [start() for start in starts]
    with ThreadPoolExecutor(len(managers)) as pool:
        servers = list(pool.map(lambda manager: manager.__enter__(), managers))
    for manager in managers:
        stack.push(manager.__exit__)
    return servers


def _assert_as_cold(answer: Completion, reference: Completion) -> None:
    assert answer.text == reference.text
    assert answer.logprobs == pytest.approx(reference.logprobs, abs=1e-6)


@pytest.mark.parametrize("family", ["granite", "nemotron"])
def test_a_restarted_hybrid_vllm_and_a_second_one_load_the_prompt_and_answer_as_a_cold_run(
    family: str, kv_engine: RunningEngine, tmp_path: Path
) -> None:
    block = HYBRID_BLOCK[family]
    model = hybrid_model_dir(family)
    recipe = hybrid_recipe(block)
    prompt = random_prompt(PROMPT_TOKENS, seed=len(family))
    full_tokens = (PROMPT_TOKENS - 1) // block * block
    with ExitStack() as stack:
        plain, first = _start_together(
            stack,
            [
                lambda: connector_vllm(
                    tmp_path / "plain",
                    kv_engine,
                    model_dir=model,
                    kv_connector="none",
                    extra_args=recipe,
                    block_size=block,
                ),
                lambda: connector_vllm(
                    tmp_path / "first",
                    kv_engine,
                    model_dir=model,
                    extra_args=recipe,
                    block_size=block,
                ),
            ],
        )
        reference = plain.complete(prompt)
        cold = first.complete(prompt)
        assert cold.cached_tokens == 0
        _assert_as_cold(cold, reference)
        _wait_stored(kv_engine, _stored_keys(first, prompt))

        with ThreadPoolExecutor(1) as pool:
            restart = pool.submit(
                first.managed.restart,
                env=connector_environment(kv_engine.settings, tmp_path / "cache"),
                ready_timeout_s=READY_TIMEOUT_S,
            )
            (second,) = _start_together(
                stack,
                [
                    lambda: connector_vllm(
                        tmp_path / "second",
                        kv_engine,
                        model_dir=model,
                        extra_args=recipe,
                        block_size=block,
                    )
                ],
            )
            restart.result()

        for server in (first, second):
            hits_before = server.external_hits()
            warm = server.complete(prompt)
            assert (warm.cached_tokens, server.external_hits() - hits_before) == (
                full_tokens,
                full_tokens,
            )
            _assert_as_cold(warm, reference)
            assert "a Mamba state" in server.log_text()
