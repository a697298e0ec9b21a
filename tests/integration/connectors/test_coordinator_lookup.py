"""The coordinator's whole directory answer and its instance list, against a real `lmcache
coordinator`: the chunk count follows its --chunk-size and each chunk's hash is the blake3 chain
the server computes (what diagnose_miss compares to find a coordinator that cuts or hashes
differently)."""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.lmcache.coordinator import CoordinatorHttp
from graph_kvcache_mcp.domain.diagnosis.tier_facts import directory_facts
from graph_kvcache_mcp.domain.lmcache.chunk_keys import chunk_hashes
from graph_kvcache_mcp.domain.outcomes import Unavailable
from tests.support.coordinator import running_coordinator

pytestmark = [pytest.mark.lmcache]
TOKENS = list(range(1, 1101))  # four whole chunks of 256, two of 512


@pytest.mark.parametrize("chunk_size", [256, 512])
async def test_the_directory_cuts_and_hashes_a_prompt_as_its_chunk_size_says(
    tmp_path: Path, chunk_size: int
) -> None:
    with running_coordinator(tmp_path, chunk_size=chunk_size) as url:
        async with CoordinatorHttp(url) as coordinator:
            lookup = await coordinator.lookup(TOKENS, model="m")
            instances = await coordinator.instances()
    assert not isinstance(lookup, Unavailable) and not isinstance(instances, Unavailable)
    facts = directory_facts(lookup, instances, this_instance=None)
    assert facts.chunks == len(TOKENS) // chunk_size
    assert facts.chunk_hashes == [h.hex() for h in chunk_hashes(TOKENS, chunk_size=chunk_size)]
    assert (facts.l1_elsewhere, facts.l2_by_gone, instances) == ([], False, [])
