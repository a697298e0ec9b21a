"""A certificate failure, named: what the peer's certificate failed, which CAs this process
trusted, and how to trust a private CA (a fleet's).

Our TLS clients (the engine wire's stdlib `ssl`, httpx2 for vLLM and LMCache) fail a handshake
with `ssl.SSLCertVerificationError`, which their callers wrap (httpx2's `ConnectError`, our
`WireBroken`): without this the reason read "ConnectError" and hid that the server answered and
only its certificate was not trusted. Both clients take trusted CAs from `SSL_CERT_FILE`, then
`SSL_CERT_DIR`, else the system store; that is what the reason names.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

CA_FILE_VARIABLE = "SSL_CERT_FILE"
CA_DIR_VARIABLE = "SSL_CERT_DIR"


@dataclass(frozen=True)
class ClientTls:
    """A TLS client context given to a client (a fleet's mutual TLS, `tls_client.client_tls`)
    and the CAs it trusts, which a certificate failure names instead of the environment's."""

    context: ssl.SSLContext
    trusted: str

    def __repr__(self) -> str:
        return f"ClientTls(trusted={self.trusted!r})"


def certificate_failure(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification error `exc` is or was raised from (its `__cause__` /
    `__context__` chain), else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLCertVerificationError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def trusted_cas() -> str:
    """Where this process's TLS clients took the CAs they trust from."""
    if path := os.environ.get(CA_FILE_VARIABLE, "").strip():
        return f"{CA_FILE_VARIABLE}={path}"
    if path := os.environ.get(CA_DIR_VARIABLE, "").strip():
        return f"{CA_DIR_VARIABLE}={path}"
    return f"the system store ({ssl.get_default_verify_paths().openssl_cafile})"


def explain_certificate_failure(
    error: ssl.SSLCertVerificationError, *, trusted: str | None = None
) -> str:
    """`certificate verify failed: <why>`, the CAs used, and the fix; `trusted`: the client was
    given its CAs (a fleet file's tls_dir, `tls_client.trusted_by`), not the environment's."""
    why = error.verify_message or error.reason or "unknown reason"
    if trusted is not None:
        return (
            f"certificate verify failed: {why} (trusted CAs: {trusted}); the peer's certificate "
            "must be issued by the same fleet CA as this host's (`fleet pki issue` from one "
            "`fleet pki init` dir) and name the address it is reached at"
        )
    return (
        f"certificate verify failed: {why} (trusted CAs: {trusted_cas()}); to trust a private "
        f"CA such as the fleet's, set {CA_FILE_VARIABLE} to its ca.pem (the one `fleet pki "
        "issue` writes) and restart"
    )


def certificate_reason(exc: BaseException, *, trusted: str | None = None) -> str | None:
    """`explain_certificate_failure` of the certificate failure behind `exc`, if there is one."""
    error = certificate_failure(exc)
    return None if error is None else explain_certificate_failure(error, trusted=trusted)
