"""medtx: a clinical-transformer pipeline library.

`medtx/` holds pure, typed functions (data in, data out) and never imports Prefect;
`flows/` wires them into Prefect flows and the `medtx` CLI; `warehouse/` owns the SQL
schema; `dashboard/` only reads the published warehouse snapshot.
"""

__version__ = "0.1.0"
