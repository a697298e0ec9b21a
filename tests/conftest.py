"""Session-wide real engines (memory and durable backends) on random free ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.engines import RunningEngine, running_engine
from tests.support.vllm import (  # noqa: F401  (vLLM fixtures and their ordering hook)
    pytest_collection_modifyitems,
    vllm_private,
    vllm_server,
    vllm_servers,
)


@pytest.fixture(scope="session")
def memory_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    with running_engine(tmp_path_factory.mktemp("engine-memory"), "memory") as engine:
        yield engine


@pytest.fixture(scope="session")
def durable_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    with running_engine(tmp_path_factory.mktemp("engine-durable"), "durable") as engine:
        yield engine


@pytest.fixture(params=["memory", "durable"])
def engine(
    request: pytest.FixtureRequest,
) -> RunningEngine:
    """Each test using this runs once per backend."""
    fixture: RunningEngine = request.getfixturevalue(f"{request.param}_engine")
    return fixture


@pytest.fixture
def own_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    """A private durable engine a test may stop, kill or restart."""
    with running_engine(tmp_path_factory.mktemp("engine-own"), "durable") as engine:
        yield engine
