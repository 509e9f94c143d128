"""Offline jobs: pipelines run from the command line that drive the roles or read a run directory,
but are no role themselves. :mod:`asyncrl.jobs.train` is the whole training job (preparation, the
orchestrator's supervision, final evaluation, ``summary.json``); :mod:`asyncrl.jobs.summary` its
summary; :mod:`asyncrl.jobs.signal` the learning-signal check (``asyncrl env signal``). On the top
floor, with the entry points (docs/architecture.md#floors)."""
