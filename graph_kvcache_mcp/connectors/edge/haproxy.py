"""haproxy from outside: finding the binary, its readiness signal and its runtime API.

Readiness: started with `-Ws` and `NOTIFY_SOCKET` naming a datagram socket of ours, haproxy's
master sends sd_notify `READY=1` once its worker has bound every listener (measured: 0.05 s). We
bind that socket in the edge's private dir (0600), so no other user can send a false READY.

The runtime API (`stats socket ... level admin`, 0600 in the same dir) answers one command per
connection; `set ssl cert` + `commit ssl cert` swap the served certificate with no reload.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from graph_kvcache_mcp.errors import EdgeProcessError

INSTALL_LINE = "apt-get install -y haproxy"
_SBIN = ("/usr/sbin", "/usr/local/sbin")
MAX_UNIX_PATH_BYTES = 107
RUNTIME_TIMEOUT_S = 5.0
_MAX_REPLY_BYTES = 1024 * 1024
_SERIAL = re.compile(r"^Serial:\s*([0-9A-Fa-f]+)\s*$", re.MULTILINE)


def haproxy_binary() -> Path:
    """The haproxy binary on PATH (or in the sbin dirs a user's PATH may lack).

    Raises:
        EdgeProcessError: haproxy is not installed; names the install line.
    """
    found = shutil.which("haproxy") or shutil.which("haproxy", path=os.pathsep.join(_SBIN))
    if found is None:
        raise EdgeProcessError(
            f"haproxy is not installed, and the edge runs it; install it with: {INSTALL_LINE}"
        )
    return Path(found)


def check_socket_path(path: Path) -> None:
    """Raise when `path` is too long for a unix socket.

    Raises:
        EdgeProcessError: says to choose a shorter --data-dir.
    """
    if len(os.fsencode(path)) > MAX_UNIX_PATH_BYTES:
        raise EdgeProcessError(
            f"{path} is too long for a unix socket ({MAX_UNIX_PATH_BYTES} bytes at most); "
            "choose a shorter --data-dir"
        )


@contextlib.contextmanager
def notify_socket(path: Path) -> Iterator[socket.socket]:
    """A datagram socket bound at `path` (0600) for haproxy's READY=1; removed on exit."""
    check_socket_path(path)
    path.unlink(missing_ok=True)
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        receiver.bind(str(path))
        os.chmod(path, 0o600)
        yield receiver
    finally:
        receiver.close()
        path.unlink(missing_ok=True)


def wait_notified_ready(
    receiver: socket.socket, process: subprocess.Popen[bytes], timeout_s: float
) -> str | None:
    """Wait for `READY=1` from `process`; None once it came, else why not (it exited, or the
    time ran out)."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if process.poll() is not None:
            return f"haproxy exited with code {process.returncode} before it was ready"
        receiver.settimeout(min(0.1, left))
        try:
            message = receiver.recv(4096)
        except TimeoutError:
            continue
        if b"READY=1" in message.split(b"\n"):
            return None
    return f"haproxy did not report ready within {timeout_s:g} s"


def runtime_command(stats_socket: Path, command: str, payload: str | None = None) -> str:
    """Send one command to haproxy's runtime API and return its whole answer.

    `payload` (a PEM, say) follows the command as haproxy's `<<` multi-line form.

    Raises:
        EdgeProcessError: the socket cannot be reached or does not answer in time.
    """
    request = command if payload is None else f"{command} <<\n{payload.rstrip()}\n"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(RUNTIME_TIMEOUT_S)
            conn.connect(str(stats_socket))
            conn.sendall(request.encode() + b"\n")
            chunks: list[bytes] = []
            size = 0
            while size < _MAX_REPLY_BYTES and (chunk := conn.recv(65536)):
                chunks.append(chunk)
                size += len(chunk)
    except OSError as exc:
        raise EdgeProcessError(
            f"the edge's runtime API at {stats_socket} did not answer "
            f"{command.split()[0]!r} ({exc.strerror or type(exc).__name__})"
        ) from None
    return b"".join(chunks).decode(errors="replace")


def served_serial(stats_socket: Path, certificate_path: Path) -> str | None:
    """The serial of the certificate haproxy serves for `certificate_path` (lower-case hex),
    None when it does not say."""
    answer = runtime_command(stats_socket, f"show ssl cert {certificate_path}")
    found = _SERIAL.search(answer)
    return found.group(1).lower().lstrip("0") or "0" if found else None


def swap_certificate(stats_socket: Path, certificate_path: Path, pem: str) -> None:
    """Serve `pem` (certificate and key) for `certificate_path` from now on, with no reload:
    new handshakes get it; established connections keep theirs.

    Raises:
        EdgeProcessError: haproxy refused the certificate (quoting why); nothing changed.
    """
    staged = runtime_command(stats_socket, f"set ssl cert {certificate_path}", pem)
    if "Transaction created" not in staged and "Transaction updated" not in staged:
        runtime_command(stats_socket, f"abort ssl cert {certificate_path}")
        raise EdgeProcessError(f"haproxy refused the new certificate: {_first_line(staged)}")
    committed = runtime_command(stats_socket, f"commit ssl cert {certificate_path}")
    if "Success!" not in committed:
        runtime_command(stats_socket, f"abort ssl cert {certificate_path}")
        raise EdgeProcessError(f"haproxy did not commit the new certificate: {committed[-300:]}")


def _first_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[0] if lines else "(no answer)")[:300]
