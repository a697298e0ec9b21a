"""`edge start|status|stop|rotate` from the command line without a running edge: bad routes exit
2 before anything starts, an absent edge is reported (exit 3 for status and rotate)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_kvcache_mcp.cli import main


@pytest.mark.parametrize(
    ("routes", "says"),
    [
        (["--inbound", "http:10.0.0.1:9443"], "needs a port"),
        (["--inbound", "ftp:10.0.0.1:9443>9130"], "must start with http: or tcp:"),
        (["--outbound", "http:19130>10.0.0.1:9443"], "names no peer"),
        ([], "at least one"),
    ],
)
def test_a_bad_route_exits_2_with_the_reason_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], routes: list[str], says: str
) -> None:
    args = ["edge", "start", "--data-dir", str(tmp_path), "--tls-dir", str(tmp_path / "tls")]
    assert main([*args, *routes, "--json"]) == 2
    assert says in json.loads(capsys.readouterr().out)["error"]
    assert not (tmp_path / "edge").exists()


def test_status_and_stop_without_an_edge_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["edge", "status", "--data-dir", str(tmp_path), "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["running"] is False
    assert main(["edge", "stop", "--data-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["how"] == "not_running"
    assert main(["edge", "rotate", "--data-dir", str(tmp_path), "--tls-dir", str(tmp_path)]) == 3
    assert "no managed edge runs" in capsys.readouterr().err
