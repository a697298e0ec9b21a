"""The fleet's trust root on disk: make the CA, issue host certificates, load a host's TLS dir.

A PKI dir holds `ca.pem` and `ca.key`; a host's TLS dir holds `ca.pem`, `cert.pem` and `key.pem`.
Every directory is 0700 and ours, every file 0600, written atomically and never through a link
(`private`). A CA is never overwritten: `init` on a dir that holds one is refused, so a fleet
cannot lose its trust root by a repeated command. Keys are EC P-256 (what every TLS stack of
the fleet speaks). The rules (names, addresses, validity, usages) are `domain.edge.pki`'s.
"""

from __future__ import annotations

import secrets
import stat
from datetime import datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from graph_kvcache_mcp.connectors.files.private import (
    DIR_MODE,
    create_private,
    private_dir,
    read_private,
    write_private,
)
from graph_kvcache_mcp.domain.edge.pki import (
    CA_VALIDITY,
    HOST_VALIDITY,
    CaSummary,
    HostCertificate,
    HostRequest,
    IpAddress,
    ca_common_name,
    validity,
)
from graph_kvcache_mcp.errors import ConfigError

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
HOST_CERT = "cert.pem"
HOST_KEY = "key.pem"
_HOST_USAGES = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]


def init_ca(directory: Path, *, now: datetime) -> CaSummary:
    """Make a new fleet CA in `directory` (created 0700).

    Raises:
        ConfigError: the dir already holds a CA, is a link, or is not ours.
    """
    home = _own_dir(directory)
    if (home / CA_CERT).exists() or (home / CA_KEY).exists():
        raise ConfigError(
            f"{home} already holds a fleet CA; refusing to overwrite it (every host trusts it). "
            "Issue host certificates from it with `fleet pki issue`, or choose another --dir"
        )
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, ca_common_name(secrets.token_hex(4)))]
    )
    window = validity(now, CA_VALIDITY)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(window.not_before)
        .not_valid_after(window.not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    # The key first and exclusively: of two racing `init`s exactly one makes the CA.
    if not create_private(home / CA_KEY, _key_pem(key)):
        raise ConfigError(f"{home} already holds a fleet CA key; refusing to overwrite it")
    write_private(home / CA_CERT, _cert_pem(certificate))
    return _ca_summary(home, certificate)


def issue(pki_dir: Path, request: HostRequest, out_dir: Path, *, now: datetime) -> HostCertificate:
    """Issue a certificate for `request` from the CA in `pki_dir`; write `ca.pem`, `cert.pem`
    and `key.pem` into `out_dir` (0700, files 0600).

    Raises:
        ConfigError: no CA in `pki_dir`, or a dir that is a link or not ours.
    """
    ca_cert, ca_key = _load_ca(pki_dir)
    home = _own_dir(out_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    window = validity(now, min(HOST_VALIDITY, ca_cert.not_valid_after_utc - now))
    names: list[x509.GeneralName] = [x509.DNSName(request.name)]
    names += [x509.IPAddress(address) for address in request.addresses]
    ca_public = ca_cert.public_key()
    assert isinstance(ca_public, ec.EllipticCurvePublicKey)  # we made it (see init_ca)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, request.name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(window.not_before)
        .not_valid_after(window.not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(_HOST_USAGES), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    write_private(home / HOST_KEY, _key_pem(key))
    write_private(home / HOST_CERT, _cert_pem(certificate))
    write_private(home / CA_CERT, _cert_pem(ca_cert))
    return describe_host(certificate, ca_cert, directory=home)


class TlsBundle:
    """A host's TLS dir, loaded and checked: its certificate chains to its CA and serves both
    directions. Its key is kept out of every repr."""

    def __init__(self, ca_pem: str, cert_pem: str, key_pem: str, summary: HostCertificate) -> None:
        self.ca_pem = ca_pem
        self.cert_pem = cert_pem
        self._key_pem = key_pem
        self.summary = summary

    def __repr__(self) -> str:
        return f"TlsBundle(name={self.summary.name!r}, serial={self.summary.serial!r})"

    def haproxy_pem(self) -> str:
        """Certificate and key as one PEM, the form haproxy's `crt` and runtime API take."""
        return self.cert_pem.rstrip("\n") + "\n" + self._key_pem.rstrip("\n") + "\n"


def load_tls_dir(directory: Path, *, now: datetime) -> TlsBundle:
    """The host certificate, key and CA in `directory`, checked against each other.

    Raises:
        ConfigError: a file missing or unreadable, the certificate not from that CA, not valid
            now, without both usages, or the key not the certificate's.
    """
    texts = {name: _read(directory / name) for name in (CA_CERT, HOST_CERT, HOST_KEY)}
    ca_cert = _parse_cert(directory / CA_CERT, texts[CA_CERT])
    cert = _parse_cert(directory / HOST_CERT, texts[HOST_CERT])
    key = _parse_key(directory / HOST_KEY, texts[HOST_KEY])
    where = f"{directory / HOST_CERT}"
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise ConfigError(
            f"{where} was not issued by the CA in {directory / CA_CERT} ({type(exc).__name__}); "
            "issue it again with `fleet pki issue`"
        ) from None
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise ConfigError(
            f"{where} is valid from {cert.not_valid_before_utc} to {cert.not_valid_after_utc}, "
            "not now; issue a new one with `fleet pki issue`"
        )
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    if not all(oid in usages for oid in _HOST_USAGES):
        raise ConfigError(
            f"{where} lacks serverAuth or clientAuth; issue it with `fleet pki issue`"
        )
    if key.public_key() != cert.public_key():
        raise ConfigError(f"{directory / HOST_KEY} is not the key of {where}")
    summary = describe_host(cert, ca_cert, directory=None)
    return TlsBundle(texts[CA_CERT], texts[HOST_CERT], texts[HOST_KEY], summary)


def describe_pem(cert_pem: str, ca_pem: str) -> HostCertificate | None:
    """The host certificate at the head of `cert_pem` (a haproxy PEM: certificate, then key),
    issued by `ca_pem`'s CA; None when either is not a certificate."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        ca_cert = x509.load_pem_x509_certificate(ca_pem.encode())
        return describe_host(cert, ca_cert, directory=None)
    except (ValueError, x509.ExtensionNotFound):
        return None


def describe_host(
    cert: x509.Certificate, ca_cert: x509.Certificate, *, directory: Path | None
) -> HostCertificate:
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    addresses: list[IpAddress] = [
        a for a in sans.get_values_for_type(x509.IPAddress) if not hasattr(a, "prefixlen")
    ]
    dns = sans.get_values_for_type(x509.DNSName)
    return HostCertificate(
        name=dns[0] if dns else "",
        addresses=[str(a) for a in addresses],
        serial=f"{cert.serial_number:x}",
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        ca_fingerprint_sha256=ca_cert.fingerprint(hashes.SHA256()).hex(),
        directory=None if directory is None else str(directory),
    )


# --- internals --------------------------------------------------------------------------------


def _own_dir(directory: Path) -> Path:
    """`directory` created 0700 and ours; a shared one (sticky, like /tmp) is refused: keys go
    in a directory of their own."""
    home = private_dir(directory.expanduser())
    if stat.S_IMODE(home.lstat().st_mode) != DIR_MODE:
        raise ConfigError(
            f"{home} is a shared directory (mode {stat.S_IMODE(home.lstat().st_mode):o}); keys "
            "go in a directory of their own: give a new one (it is created 0700)"
        )
    return home


def _load_ca(pki_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    home = pki_dir.expanduser()
    if not (home / CA_KEY).exists():
        raise ConfigError(f"{home} holds no fleet CA; make one with `fleet pki init --dir {home}`")
    cert = _parse_cert(home / CA_CERT, _read(home / CA_CERT))
    key = _parse_key(home / CA_KEY, _read(home / CA_KEY))
    return cert, key


def _read(path: Path) -> str:
    text = read_private(path)
    if text is None:
        raise ConfigError(f"{path} is missing; a TLS dir holds ca.pem, cert.pem and key.pem")
    return text


def _parse_cert(path: Path, text: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(text.encode())
    except ValueError:
        raise ConfigError(f"{path} is not a PEM certificate") from None


def _parse_key(path: Path, text: str) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(text.encode(), password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{path} is not an EC key (fleet keys are EC P-256)")
    return key


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _ca_summary(home: Path, cert: x509.Certificate) -> CaSummary:
    return CaSummary(
        directory=str(home),
        ca_certificate=str(home / CA_CERT),
        subject=cert.subject.rfc4514_string(),
        fingerprint_sha256=cert.fingerprint(hashes.SHA256()).hex(),
        not_after=cert.not_valid_after_utc,
    )
