"""Dash dashboard over the published warehouse snapshot: `create_app(snapshot_path) -> Dash`."""

from dashboard.app import create_app, resolve_snapshot

__all__ = ["create_app", "resolve_snapshot"]
