"""What the dashboard reads: the published read-only snapshot of the warehouse (`snapshot`) and the read models
(`dash.*` marts) materialised into it (`marts`)."""
