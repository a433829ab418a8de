"""The address a server of this project listens on (`python -m serve`, `python -m web`): bound before the slow
start-up, so that a port in use, a privileged port or a host that is not this machine's is one plain line."""
from __future__ import annotations

import errno
import socket


def listening_socket(host: str, port: int) -> socket.socket:
    """``host``:``port`` bound, not listening: held while a server starts up, closed as it binds for itself."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    return sock


def address_error(host: str, port: int, e: OSError, port_option: str = "--port") -> str:
    """Why a server cannot listen on ``host``:``port``, with what to do (``port_option``: how its port is set)."""
    if e.errno == errno.EADDRINUSE:
        return (f"{host}:{port} is already in use (another server, or an earlier run still going?): stop that "
                f"process or choose a free port with {port_option}")
    if e.errno == errno.EACCES:
        return f"{host}:{port}: permission denied (ports below 1024 need privileges): choose 1024 or above"
    hint = "127.0.0.1: this machine alone, 0.0.0.0: every interface"
    if isinstance(e, socket.gaierror):
        return f"--host {host} does not resolve to an address ({hint})"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"--host {host} is not an address of this machine ({hint})"
    return f"cannot listen on {host}:{port}: {e.strerror or e}"
