"""A second local user probing what the processes we start expose (test double for an attacker;
run as `nobody` through `as_nobody`). Prints one JSON object.

    neighbour.py http METHOD URL [JSON] -> {"status": int | null, "body": str, "error": str}
        (JSON: a request body, sent as application/json)
    neighbour.py connect ENDPOINT       -> {"connected": bool, "error": str}
        (ENDPOINT: tcp://host:port or ipc:///path; connect() itself, no protocol spoken)
    neighbour.py replay ENDPOINT        -> {"frames": [[hex, ...], ...], "error": str}
        (asks a vLLM KV-event replay socket for everything from sequence 0; needs pyzmq)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

SYSTEM_PYTHON = "/usr/bin/python3"


def can_run_as_nobody() -> bool:
    """Root, with setpriv and a system Python another user may run."""
    return os.geteuid() == 0 and bool(shutil.which("setpriv")) and os.access(SYSTEM_PYTHON, os.X_OK)


def as_nobody(*args: str, python: str = SYSTEM_PYTHON) -> dict[str, Any]:
    """Run this script as `nobody` (no groups) with `args`; its JSON answer."""
    return _run(list(AS_NOBODY), python, args)


def as_owner(*args: str, python: str = SYSTEM_PYTHON) -> dict[str, Any]:
    """The same probe as this user: what the owner still reaches."""
    return _run([], python, args)


AS_NOBODY = ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")
SQUATTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "squatter.py")


def squat_now(port: int) -> subprocess.Popen[str]:
    """`nobody` listening on loopback `port` from now on (`squatter.py`), recording what each
    connection sends; returns once the port is its."""
    squatter = subprocess.Popen(
        [*AS_NOBODY, SYSTEM_PYTHON, SQUATTER, str(port), "listen", ""],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert squatter.stdout is not None
    assert squatter.stdout.readline().strip() == "ready"
    assert squatter.stdout.readline().strip() == "won", f"port {port} was taken already"
    return squatter


def squatter_received(squatter: subprocess.Popen[str]) -> list[bytes]:
    """Stop the squatter; what each connection it accepted sent (b"" for one that sent
    nothing)."""
    squatter.kill()
    out, _ = squatter.communicate(timeout=30)
    return [bytes.fromhex(line[4:]) for line in out.splitlines() if line.startswith("got ")]


def _run(prefix: list[str], python: str, args: tuple[str, ...]) -> dict[str, Any]:
    done = subprocess.run(
        [*prefix, python, __file__, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"the neighbour failed: {done.stderr[-2000:]}")
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def http(method: str, url: str, body: str | None = None) -> dict[str, object]:
    data = None if body is None else body.encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return {"status": response.status, "body": response.read().decode(errors="replace")}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": exc.read().decode(errors="replace")}
    except OSError as exc:
        return {"status": None, "body": "", "error": str(exc)}


def connect(endpoint: str) -> dict[str, object]:
    scheme, _, where = endpoint.partition("://")
    try:
        if scheme == "ipc":
            with socket.socket(socket.AF_UNIX) as conn:
                conn.settimeout(5)
                conn.connect(where)
        else:
            host, _, port = where.rpartition(":")
            socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        return {"connected": False, "error": str(exc)}
    return {"connected": True, "error": ""}


def replay(endpoint: str) -> dict[str, object]:
    import zmq

    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    frames: list[list[str]] = []
    try:
        dealer.connect(endpoint)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        while dealer.poll(5000):
            reply = dealer.recv_multipart()
            frames.append([part.hex() for part in reply])
            if len(reply) > 2 and reply[2] == b"\xff" * 8:
                break
    except zmq.ZMQError as exc:
        return {"frames": frames, "error": str(exc)}
    finally:
        dealer.close()
        context.term()
    return {"frames": frames, "error": ""}


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "http":
        print(json.dumps(http(*args[:3])))
    elif mode == "connect":
        print(json.dumps(connect(args[0])))
    elif mode == "replay":
        print(json.dumps(replay(args[0])))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
