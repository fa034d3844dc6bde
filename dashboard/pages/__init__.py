"""The dashboard's pages: each module exposes PATH, NAME, layout(snapshot, params) and register(app, snapshot)."""
