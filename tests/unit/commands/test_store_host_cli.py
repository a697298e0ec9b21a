"""`engine start --listen` and `lmcache coordinator start --listen/--node` refuse bad flags at the
edge of the CLI (exit 2, saying what is wrong) before anything starts: no engine, coordinator or
edge is left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_kvcache_mcp.cli import main
from tests.support.fleet_tls import FleetTls, make_fleet_tls

STORE_ADDRESS = "10.254.254.254"  # named by the certificate, held by no interface here


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> FleetTls:
    return make_fleet_tls(tmp_path_factory.mktemp("tls"), store_address=STORE_ADDRESS)


def _refusal(capsys: pytest.CaptureFixture[str], data_dir: Path, *argv: object) -> str:
    code = main([*(str(a) for a in argv), "--data-dir", str(data_dir), "--json"])
    error: str = json.loads(capsys.readouterr().out)["error"]
    assert code == 2, error
    for home in ("engine", "lmcache-coordinator", "edge"):
        assert not (data_dir / home / "state.json").exists(), home
    return error


ENGINE = ("engine", "start")
COORDINATOR = ("lmcache", "coordinator", "start")


@pytest.mark.parametrize(
    ("command", "flags", "says"),
    [
        (ENGINE, ["--listen", f"{STORE_ADDRESS}:9443"], "--listen needs --tls-dir"),
        (ENGINE, ["--tls-dir", "{tls}"], "--tls-dir needs --listen"),
        (ENGINE, ["--listen", "127.0.0.1:9443", "--tls-dir", "{tls}"], "not a host's network"),
        (ENGINE, ["--listen", f"{STORE_ADDRESS}:http", "--tls-dir", "{tls}"], "needs a port"),
        (ENGINE, ["--listen", "10.0.0.5:9443", "--tls-dir", "{tls}"], "IP SANs: 10.254.254.254"),
        (
            ENGINE,
            ["--listen", f"{STORE_ADDRESS}:9443", "--tls-dir", "{tls}"],
            f"{STORE_ADDRESS} is not an address of this host",
        ),
        (COORDINATOR, ["--node", "node-2@10.0.0.2:9560"], "--node needs --tls-dir"),
        (COORDINATOR, ["--node", "10.0.0.2:9560", "--tls-dir", "{tls}"], "names no node"),
        (COORDINATOR, ["--node", "n@localhost:9560", "--tls-dir", "{tls}"], "not an IPv4 address"),
        (COORDINATOR, ["--listen", f"{STORE_ADDRESS}:9444"], "--listen needs --tls-dir"),
        (COORDINATOR, ["--listen", "10.0.0.5:9444", "--tls-dir", "{tls}"], "IP SANs: 10.254."),
    ],
)
def test_a_bad_publication_is_refused_before_anything_starts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tls: FleetTls,
    command: tuple[str, ...],
    flags: list[str],
    says: str,
) -> None:
    argv = [flag.replace("{tls}", str(tls.store)) for flag in flags]
    assert says in _refusal(capsys, tmp_path, *command, *argv)


def test_coordinator_status_and_stop_without_one_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lmcache", "coordinator", "status", "--data-dir", str(tmp_path), "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["running"] is False
    assert main(["lmcache", "coordinator", "stop", "--data-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["how"] == "not_running"
