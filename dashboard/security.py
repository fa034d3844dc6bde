"""Who may see the dashboard: it shows patient-level data, so anything but loopback needs a password.

HTTP basic auth from the environment (`MEDTX_DASHBOARD_PASSWORD`, user `MEDTX_DASHBOARD_USER`, default
`medtx`). Put it behind TLS (a reverse proxy) when it leaves the machine: basic auth sends the password
base64-encoded, not encrypted.
"""

from __future__ import annotations

import hmac
import ipaddress
import os

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


def install_basic_auth(server: Flask, user: str, password: str) -> None:
    """Every request (pages, callbacks, assets) must carry the credentials."""

    def check() -> Response | None:
        auth = request.authorization
        given_user = (auth.username or "") if auth else ""
        given_password = (auth.password or "") if auth else ""
        # compare_digest on both, always, so timing says nothing about which part was wrong.
        ok_user = hmac.compare_digest(given_user.encode(), user.encode())
        ok_password = hmac.compare_digest(given_password.encode(), password.encode())
        if ok_user and ok_password:
            return None
        return Response("authentication required", 401, {"WWW-Authenticate": 'Basic realm="medtx"'})

    server.before_request(check)
