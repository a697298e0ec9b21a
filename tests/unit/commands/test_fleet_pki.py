"""`fleet pki init|issue` from the command line: JSON results, exit 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_kvcache_mcp.cli import main


def test_init_then_issue_print_their_results_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fleet", "pki", "init", "--dir", str(tmp_path / "pki"), "--json"]) == 0
    ca = json.loads(capsys.readouterr().out)
    args = ["--name", "store", "--ip", "10.0.0.1", "--out", str(tmp_path / "store"), "--json"]
    assert main(["fleet", "pki", "issue", "--dir", str(tmp_path / "pki"), *args]) == 0
    issued = json.loads(capsys.readouterr().out)
    assert issued["ca_fingerprint_sha256"] == ca["fingerprint_sha256"]
    assert issued["addresses"] == ["10.0.0.1"]
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [
        "ca.pem",
        "cert.pem",
        "key.pem",
    ]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--name", "Store", "--ip", "10.0.0.1"], "not a DNS name"),
        (["--name", "store", "--ip", "10.0.0"], "not an IP address"),
        (["--name", "store"], "--ip"),
    ],
)
def test_a_bad_name_or_address_exits_2_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    assert main(["fleet", "pki", "init", "--dir", str(tmp_path / "pki")]) == 0
    args = ["fleet", "pki", "issue", "--dir", str(tmp_path / "pki"), "--out", str(tmp_path / "o")]
    assert main([*args, *extra]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_second_init_exits_2_and_keeps_the_ca(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fleet", "pki", "init", "--dir", str(tmp_path)]) == 0
    key = (tmp_path / "ca.key").read_bytes()
    assert main(["fleet", "pki", "init", "--dir", str(tmp_path)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert (tmp_path / "ca.key").read_bytes() == key
