"""`cache warm|evict|pin|unpin`: bad input exits 2 with one line; an instance without an LMCache
server is a clear error; a server that does not answer exits 3 with the reason, never "done"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.services.cache.operations import CacheOut


def fleet_file(tmp_path: Path, **extra: str) -> str:
    entry = {"name": "a", "base_url": f"http://127.0.0.1:{free_port()}/v1", **extra}
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"instances": [entry]}))
    return str(path)


def test_a_warm_with_a_bad_timeout_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["cache", "warm", "--fleet", fleet_file(tmp_path), "--instance", "a", "--prompt", "x"]
    assert main([*argv, "--timeout", "0"]) == 2
    assert "--timeout" in capsys.readouterr().err


def test_an_instance_without_an_lmcache_server_is_refused_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["cache", "evict", "--fleet", fleet_file(tmp_path), "--instance", "a", "--prompt", "x"]
    assert main(argv) == 2
    assert "lmcache_http_url" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["warm", "evict", "pin", "unpin"])
def test_a_server_that_does_not_answer_exits_3_with_the_reason(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = f"http://127.0.0.1:{free_port()}"
    path = fleet_file(tmp_path, lmcache_http_url=server)
    argv = ["cache", verb, "--fleet", path, "--instance", "a", "--prompt", "x", "--json"]
    assert main(argv) == 3
    out = CacheOut.model_validate_json(capsys.readouterr().out)
    assert out.done is False and out.reason is not None and server in out.reason


@pytest.mark.parametrize("verb", ["warm", "evict"])
def test_a_fleet_of_one_instance_needs_no_instance_flag(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the fleet verbs do: the one instance is the one meant (here its server is down)."""
    server = f"http://127.0.0.1:{free_port()}"
    path = fleet_file(tmp_path, lmcache_http_url=server)
    assert main(["cache", verb, "--fleet", path, "--prompt", "x", "--json"]) == 3
    out = CacheOut.model_validate_json(capsys.readouterr().out)
    assert out.instance == "a" and out.reason is not None and server in out.reason


def test_a_fleet_of_several_instances_asks_which_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = [
        {"name": name, "base_url": f"http://127.0.0.1:{free_port()}/v1"} for name in ("a", "b")
    ]
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"instances": entries}))
    assert main(["cache", "warm", "--fleet", str(path), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "2 instances (a, b)" in err and "--instance" in err
