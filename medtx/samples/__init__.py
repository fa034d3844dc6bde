"""The sample-building kit: the task-independent pieces every task's builder (medtx/tasks/<name>.py) uses.

- `clock`: when each table's events become known (the event-time rule; docs/TASKS.md);
- `common`: the per-admission visits, the clock-bounded history relation, `store_task` (samples + split + vocab +
  summary in one transaction), `EmptyCohortError`;
- `splits`, `vocab`: patient/group splits and training-split vocabularies (`samples.splits`, `samples.vocab`);
- `reference`: the drug_rec definition as a plain per-patient loop, the SQL's cross-check.

A lower layer: it never imports medtx.tasks (an import-linter contract in pyproject.toml). The registry-driven
entry point, `build_samples`, is medtx.tasks.build.
"""
