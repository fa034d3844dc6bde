"""Bring your own ACES task (issue 45): an ACES task config named in the pipeline config is a binary medtx task.

- `medtx.aces.run`: write a dataset's MEDS events and run ACES itself on them (es-aces, a subprocess: MEDTX_ACES);
- `medtx.aces.task`: the declared tasks (`AcesSpec`, `declare`, MEDTX_ACES_TASKS), their `Task` records and builder.

It sits above the task registry and the MEDS export (it imports medtx.tasks.base, medtx.meds and the
sample-building kit); the registry (medtx.tasks) loads `medtx.aces.task` by name, as it loads the task modules.
"""
