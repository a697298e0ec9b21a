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


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--listen", f"{STORE_ADDRESS}:9443"], "--listen needs --tls-dir"),
        (["--tls-dir", "{tls}"], "--tls-dir needs --listen"),
        (["--listen", "127.0.0.1:9443", "--tls-dir", "{tls}"], "not a host's network address"),
        (["--listen", f"{STORE_ADDRESS}:http", "--tls-dir", "{tls}"], "needs a port"),
        (["--listen", "10.0.0.5:9443", "--tls-dir", "{tls}"], f"IP SANs: {STORE_ADDRESS}"),
        (
            ["--listen", f"{STORE_ADDRESS}:9443", "--tls-dir", "{tls}"],
            f"{STORE_ADDRESS} is not an address of this host",
        ),
    ],
)
def test_engine_start_refuses_a_bad_publication_before_starting_anything(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tls: FleetTls,
    flags: list[str],
    says: str,
) -> None:
    argv = [flag.replace("{tls}", str(tls.store)) for flag in flags]
    assert says in _refusal(capsys, tmp_path, "engine", "start", *argv)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--node", "node-2@10.0.0.2:9560"], "--node needs --tls-dir"),
        (["--node", "10.0.0.2:9560", "--tls-dir", "{tls}"], "names no node"),
        (["--node", "node-2@localhost:9560", "--tls-dir", "{tls}"], "not an IPv4 address"),
        (["--listen", f"{STORE_ADDRESS}:9444"], "--listen needs --tls-dir"),
        (["--listen", "10.0.0.5:9444", "--tls-dir", "{tls}"], f"IP SANs: {STORE_ADDRESS}"),
    ],
)
def test_coordinator_start_refuses_bad_flags_before_starting_anything(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tls: FleetTls,
    flags: list[str],
    says: str,
) -> None:
    argv = [flag.replace("{tls}", str(tls.store)) for flag in flags]
    assert says in _refusal(capsys, tmp_path, "lmcache", "coordinator", "start", *argv)


def test_coordinator_status_and_stop_without_one_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lmcache", "coordinator", "status", "--data-dir", str(tmp_path), "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["running"] is False
    assert main(["lmcache", "coordinator", "stop", "--data-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["how"] == "not_running"
