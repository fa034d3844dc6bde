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
    """Back-off after failed logins, per key ((address, user) in `install_basic_auth`): the first `free`
    failures cost nothing, then each one doubles a lock-out (1 s, 2 s, 4 s ... capped at `cap_s`) during which
    that key's guesses are answered 429 without checking a password - so guessing is slow while a typo costs
    a user nothing. Only failures count; a success ends the key's back-off."""

    MAX_KEYS = 10_000

    def __init__(self, free: int = 5, cap_s: float = 300.0, clock=time.monotonic) -> None:
        self.free, self.cap_s, self.clock = free, cap_s, clock
        self._state: dict[object, tuple[int, float]] = {}  # key -> (failures, locked until)
        self._lock = threading.Lock()

    def wait_s(self, client: object) -> float:
        with self._lock:
            return max(0.0, self._state.get(client, (0, 0.0))[1] - self.clock())

    def failed(self, client: object) -> None:
        with self._lock:
            if len(self._state) >= self.MAX_KEYS:  # bounded memory under a spray of addresses: drop the
                now = self.clock()                 # keys not locked now (a spray cannot unlock a locked one)
                self._state = {k: v for k, v in self._state.items() if v[1] > now}
                if len(self._state) >= self.MAX_KEYS:
                    self._state.clear()
            count = self._state.get(client, (0, 0.0))[0] + 1
            delay = 0.0 if count <= self.free else min(2.0 ** (count - self.free - 1), self.cap_s)
            self._state[client] = (count, self.clock() + delay)

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._state.pop(client, None)


DEVICE_COOKIE = "medtx_device"


def install_basic_auth(server: Flask, user: str, password: str, backoff: FailureBackoff | None = None) -> None:
    """Every request (pages, callbacks, assets) must carry the credentials. Failures back off per (address,
    user) - every wrong user name from one address shares one key, so rotating names gains nothing.

    A guesser behind a shared proxy must not lock everyone out: a browser that has logged in once carries a
    device cookie (an HMAC of the user under a per-server secret), and its password is checked even during a
    lock-out - the right one gets in, a wrong one counts as a failure. Requests without it are answered 429,
    unchecked, while locked, so guessing stays slow (checking every password first would make the lock-out an
    oracle that slows nobody). A browser that never logged in waits out a lock-out of its address."""
    backoff = backoff or FailureBackoff()
    server.extensions["medtx_auth_backoff"] = backoff
    secret = os.urandom(32)
    token = hmac.new(secret, user.encode(), "sha256").hexdigest()

    def check() -> Response | None:
        from flask import g

        client = request.remote_addr or "unknown"
        auth = request.authorization
        given_user = (auth.username or "") if auth else ""
        given_password = (auth.password or "") if auth else ""
        # compare_digest on both, always, so timing says nothing about which part was wrong.
        ok_user = hmac.compare_digest(given_user.encode(), user.encode())
        ok_password = hmac.compare_digest(given_password.encode(), password.encode())
        key = (client, user if ok_user else "*")
        known_device = hmac.compare_digest(request.cookies.get(DEVICE_COOKIE, ""), token)
        wait = backoff.wait_s(key)
        if wait > 0 and not known_device:
            return Response(f"too many failed logins: retry in {math.ceil(wait)} s", 429,
                            {"Retry-After": str(math.ceil(wait))})
        if ok_user and ok_password:
            if wait == 0:
                backoff.succeeded(key)  # not while locked: the user's own requests must not reset a guesser
            g.medtx_new_device = not known_device
            return None
        if auth is not None:  # a browser's first credential-less request is not a failed guess
            backoff.failed(key)
        return Response("authentication required", 401, {"WWW-Authenticate": 'Basic realm="medtx"'})

    def remember(response: Response) -> Response:
        from flask import g

        if g.get("medtx_new_device"):
            response.set_cookie(DEVICE_COOKIE, token, httponly=True, samesite="Strict", max_age=30 * 86400)
        return response

    server.before_request(check)
    server.after_request(remember)
