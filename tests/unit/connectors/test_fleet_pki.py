"""The fleet's trust root on disk: a CA that is never overwritten, host certificates for both
directions, private files, and a TLS dir checked before an edge uses it."""

from __future__ import annotations

import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from graph_kvcache_mcp.connectors.files import pki
from graph_kvcache_mcp.domain.edge.pki import HostRequest
from graph_kvcache_mcp.errors import ConfigError

NOW = datetime.now(UTC)


def _issued(tmp_path: Path, name: str = "node-2") -> Path:
    pki.init_ca(tmp_path / "pki", now=NOW)
    out = tmp_path / name
    pki.issue(tmp_path / "pki", HostRequest.of(name, ["10.0.0.2", "127.0.0.1"]), out, now=NOW)
    return out


def test_a_host_certificate_serves_both_directions_for_its_name_and_addresses(
    tmp_path: Path,
) -> None:
    out = _issued(tmp_path)
    cert = x509.load_pem_x509_certificate((out / "cert.pem").read_bytes())
    ca = x509.load_pem_x509_certificate((out / "ca.pem").read_bytes())
    cert.verify_directly_issued_by(ca)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["node-2"]
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.2", "127.0.0.1"]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.not_valid_after_utc - NOW <= timedelta(days=397)


def test_every_file_is_private_and_every_dir_is_ours_alone(tmp_path: Path) -> None:
    out = _issued(tmp_path)
    for directory in (tmp_path / "pki", out):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        for path in directory.iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_a_ca_is_never_overwritten(tmp_path: Path) -> None:
    first = pki.init_ca(tmp_path / "pki", now=NOW)
    key = (tmp_path / "pki" / "ca.key").read_bytes()
    with pytest.raises(ConfigError, match="already holds a fleet CA"):
        pki.init_ca(tmp_path / "pki", now=NOW)
    assert (tmp_path / "pki" / "ca.key").read_bytes() == key
    assert pki.init_ca(tmp_path / "other", now=NOW).fingerprint_sha256 != first.fingerprint_sha256


def test_issuing_without_a_ca_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fleet pki init"):
        pki.issue(tmp_path, HostRequest.of("a", ["10.0.0.1"]), tmp_path / "out", now=NOW)


def test_a_linked_or_shared_output_dir_is_refused(tmp_path: Path) -> None:
    pki.init_ca(tmp_path / "pki", now=NOW)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    request = HostRequest.of("a", ["10.0.0.1"])
    with pytest.raises(ConfigError, match="symbolic link"):
        pki.issue(tmp_path / "pki", request, tmp_path / "link", now=NOW)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    with pytest.raises(ConfigError, match="shared directory"):
        pki.issue(tmp_path / "pki", request, shared, now=NOW)
    assert list((tmp_path / "real").iterdir()) == []


def test_a_tls_dir_loads_when_its_certificate_is_its_cas(tmp_path: Path) -> None:
    bundle = pki.load_tls_dir(_issued(tmp_path), now=NOW)
    assert bundle.summary.name == "node-2"
    assert "PRIVATE KEY" not in repr(bundle)
    assert "BEGIN CERTIFICATE" in bundle.haproxy_pem()
    assert "BEGIN PRIVATE KEY" in bundle.haproxy_pem()


def test_a_tls_dir_with_another_fleets_ca_is_refused(tmp_path: Path) -> None:
    out = _issued(tmp_path)
    pki.init_ca(tmp_path / "rogue", now=NOW)
    (out / "ca.pem").write_bytes((tmp_path / "rogue" / "ca.pem").read_bytes())
    with pytest.raises(ConfigError, match="not issued by the CA"):
        pki.load_tls_dir(out, now=NOW)


def test_a_tls_dir_is_refused_outside_its_certificates_validity(tmp_path: Path) -> None:
    out = _issued(tmp_path)
    with pytest.raises(ConfigError, match="not now"):
        pki.load_tls_dir(out, now=NOW + timedelta(days=400))


def test_a_tls_dir_whose_key_is_not_the_certificates_is_refused(tmp_path: Path) -> None:
    out = _issued(tmp_path)
    other = _issued(tmp_path / "b", name="node-3")
    (out / "key.pem").write_bytes((other / "key.pem").read_bytes())
    with pytest.raises(ConfigError, match="not the key"):
        pki.load_tls_dir(out, now=NOW)
