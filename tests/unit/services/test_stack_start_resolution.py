"""A stack start resolves the engine it talks to once and passes it down: the plan, the lmcache
server's token and its proof, and vLLM's environment all come from that one resolution (it reads
the data dir's state and the managed engine's token file, so twice could disagree)."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest
from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine import opener
from graph_kvcache_mcp.connectors.engine.opener import KvTarget
from graph_kvcache_mcp.domain.vllm.launch import KvConnector, Platform, VllmLaunch
from graph_kvcache_mcp.errors import LmcacheProcessError, VllmProcessError
from graph_kvcache_mcp.services.stack.lifetime import RunsUntilStop
from graph_kvcache_mcp.services.stack.start import start_vllm

CPU = Platform(kind="cpu", detail="given by the test")


class ResolverSpy:
    """A spy around the real `resolve_kv_target`: counts the calls, answers what it answers."""

    def __init__(self) -> None:
        self.real = opener.resolve_kv_target
        self.calls = 0

    def __call__(self, settings: Settings) -> KvTarget:
        self.calls += 1
        return self.real(settings)


@pytest.fixture
def resolver_spy(monkeypatch: pytest.MonkeyPatch) -> ResolverSpy:
    """The spy, in place of the resolver in every loaded module of ours that imported it."""
    spy = ResolverSpy()
    for name, module in list(sys.modules.items()):
        if name.startswith("graph_kvcache_mcp") and (
            getattr(module, "resolve_kv_target", None) is spy.real
        ):
            monkeypatch.setattr(module, "resolve_kv_target", spy)
    return spy


@pytest.mark.parametrize(
    ("connector", "fails_at"),
    [("mp_native", LmcacheProcessError), ("engine", VllmProcessError)],
)
def test_a_stack_start_resolves_the_engine_once(
    connector: KvConnector,
    fails_at: type[Exception],
    resolver_spy: ResolverSpy,
    tmp_path: Path,
) -> None:
    # A configured engine (nothing to start), and interpreters that do not exist: the start
    # goes as far as launching the lmcache server (mp_native) or vLLM (engine), then stops,
    # having resolved everything it would pass down.
    missing = tmp_path / "no-such-python"
    settings = Settings.build(
        data_dir=tmp_path / "data",
        kv_url="http://127.0.0.1:9",
        kv_token=SecretStr("token-for-the-spy"),
        vllm_python=missing,
        lmcache_python=missing,
    )
    launch = VllmLaunch(model=str(tmp_path / "model"), port=18123, kv_connector=connector)

    async def start() -> None:
        await start_vllm(
            settings,
            launch,
            RunsUntilStop(),
            ready_timeout_s=5.0,
            calls_base_url="http://127.0.0.1:18123/v1",
            platform=CPU,
        )

    with pytest.raises(fails_at):
        anyio.run(start)
    assert resolver_spy.calls == 1
