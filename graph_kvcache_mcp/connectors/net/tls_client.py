"""The one place a host's TLS dir becomes a client `ssl.SSLContext`: the fleet CA the only CA
trusted, this host's certificate and key presented (mutual TLS). The vLLM, lmcache admin,
coordinator and engine clients take it when a fleet file names `tls_dir`.

The dir is checked first by the PKI's own rules (`connectors.files.pki.load_tls_dir`: each file
private and ours, the certificate its CA's, valid now, the key its key), so a dir someone else
can write, or a certificate that cannot work, is refused with the reason before a byte goes out.
"""

from __future__ import annotations

import ssl
from datetime import UTC, datetime

from graph_kvcache_mcp.connectors.files.pki import CA_CERT, HOST_CERT, HOST_KEY, load_tls_dir
from graph_kvcache_mcp.connectors.net.tls_trust import ClientTls
from graph_kvcache_mcp.domain.targets import TlsIdentity


def client_tls(identity: TlsIdentity) -> ClientTls:
    """A client context that trusts only `identity`'s fleet CA and presents its certificate;
    the peer's name is checked against the URL's host (the fleet issues IP addresses too).
    Its `trusted` names that CA in a certificate failure.

    Raises:
        ConfigError: the TLS dir is incomplete, not private and ours, or inconsistent.
    """
    home = identity.tls_dir
    bundle = load_tls_dir(home, now=datetime.now(UTC))
    context = ssl.create_default_context(cadata=bundle.ca_pem)
    # ssl loads a certificate chain from paths only; they were checked private and ours just
    # above, so only we could have changed them since.
    context.load_cert_chain(home / HOST_CERT, home / HOST_KEY)
    return ClientTls(context, f"only the fleet CA in {home / CA_CERT} (the fleet file's tls_dir)")
