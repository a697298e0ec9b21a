"""A 401 from the managed engine names its token file, so the user knows what disagrees with
the running engine (#39 item 8); a real managed engine whose token file was replaced."""

from __future__ import annotations

from pathlib import Path

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import resolve_kv_target, sync_client_for
from graph_kvcache_mcp.connectors.files.private import write_private
from graph_kvcache_mcp.domain.outcomes import Unavailable
from tests.support.engines import running_engine


def test_a_refused_token_of_the_managed_engine_names_its_token_file(tmp_path: Path) -> None:
    with running_engine(tmp_path, "memory") as engine:
        replaced = "replaced-" + "0" * 32
        write_private(engine.managed.token_path, replaced)
        target = resolve_kv_target(Settings.build(data_dir=tmp_path))
        with sync_client_for(target, Settings.build(data_dir=tmp_path)) as client:
            outcome = client.engine_stats()
    assert isinstance(outcome, Unavailable) and outcome.status == 401
    assert str(engine.managed.token_path) in outcome.reason and "engine stop" in outcome.reason
    assert replaced not in outcome.reason
    assert engine.token.get_secret_value() not in outcome.reason
