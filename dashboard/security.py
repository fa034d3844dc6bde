"""Who may see the dashboard: it shows patient-level data, so anything but loopback needs a password.

HTTP basic auth from the environment (`MEDTX_DASHBOARD_PASSWORD`, user `MEDTX_DASHBOARD_USER`, default
`medtx`). Put it behind TLS (a reverse proxy) when it leaves the machine: basic auth sends the password
base64-encoded, not encrypted.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import os
import threading
import time

from flask import Flask, Response, request

PASSWORD_ENV = "MEDTX_DASHBOARD_PASSWORD"
USER_ENV = "MEDTX_DASHBOARD_USER"
DEFAULT_USER = "medtx"


class InsecureBindError(RuntimeError):
    """Binding to a non-loopback address without a password."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def require_password_for(host: str, password: str | None) -> None:
    """Refuse to serve patient-level data on a reachable address without credentials."""
    if not is_loopback(host) and not password:
        raise InsecureBindError(
            f"refusing to bind the dashboard to {host} without a password: it shows patient-level data. "
            f"Set {PASSWORD_ENV} (and optionally {USER_ENV}), or bind to 127.0.0.1."
        )


def credentials_from_env() -> tuple[str, str] | None:
    password = os.environ.get(PASSWORD_ENV)
    if not password:
        return None
    return os.environ.get(USER_ENV) or DEFAULT_USER, password


class FailureBackoff:
    """Per-client back-off after failed logins: the first `free` failures cost nothing, then each one
    doubles a lock-out (1 s, 2 s, 4 s ... capped at `cap_s`) during which that client is answered 429
    without checking a password - so guessing is slow while a typo costs a user nothing."""

    def __init__(self, free: int = 5, cap_s: float = 300.0, clock=time.monotonic) -> None:
        self.free, self.cap_s, self.clock = free, cap_s, clock
        self._state: dict[str, tuple[int, float]] = {}  # client -> (failures, locked until)
        self._lock = threading.Lock()

    def wait_s(self, client: str) -> float:
        with self._lock:
            return max(0.0, self._state.get(client, (0, 0.0))[1] - self.clock())

    def failed(self, client: str) -> None:
        with self._lock:
            if len(self._state) > 10_000:  # bounded memory under a spray of addresses
                self._state.clear()
            count = self._state.get(client, (0, 0.0))[0] + 1
            delay = 0.0 if count <= self.free else min(2.0 ** (count - self.free - 1), self.cap_s)
            self._state[client] = (count, self.clock() + delay)

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._state.pop(client, None)


def install_basic_auth(server: Flask, user: str, password: str, backoff: FailureBackoff | None = None) -> None:
    """Every request (pages, callbacks, assets) must carry the credentials; failures back off per client."""
    backoff = backoff or FailureBackoff()
    server.extensions["medtx_auth_backoff"] = backoff

    def check() -> Response | None:
        client = request.remote_addr or "unknown"
        wait = backoff.wait_s(client)
        if wait > 0:
            return Response(f"too many failed logins: retry in {math.ceil(wait)} s", 429,
                            {"Retry-After": str(math.ceil(wait))})
        auth = request.authorization
        given_user = (auth.username or "") if auth else ""
        given_password = (auth.password or "") if auth else ""
        # compare_digest on both, always, so timing says nothing about which part was wrong.
        ok_user = hmac.compare_digest(given_user.encode(), user.encode())
        ok_password = hmac.compare_digest(given_password.encode(), password.encode())
        if ok_user and ok_password:
            backoff.succeeded(client)
            return None
        if auth is not None:  # a browser's first credential-less request is not a failed guess
            backoff.failed(client)
        return Response("authentication required", 401, {"WWW-Authenticate": 'Basic realm="medtx"'})

    server.before_request(check)
