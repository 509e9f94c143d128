"""Offline jobs: pipelines run from the command line that drive the roles or read a run directory,
but are no role themselves. :mod:`asyncrl.jobs.train` is the whole training job (preparation, the
orchestrator's supervision, final evaluation, ``summary.json``); :mod:`asyncrl.jobs.summary` its
summary; :mod:`asyncrl.jobs.warm_start` the warm start before RL; :mod:`asyncrl.jobs.signal` the
learning-signal check (``asyncrl env signal``); :mod:`asyncrl.jobs.replay` replays a run's archived
batches (``asyncrl replay``); :mod:`asyncrl.jobs.credit_inspect` and :mod:`asyncrl.jobs.credit_ablate`
are ``asyncrl credit show`` / ``ablate``; :mod:`asyncrl.jobs.report` the HTML report (``asyncrl
report``); :mod:`asyncrl.jobs.runs` ``asyncrl runs list`` / ``compare``; :mod:`asyncrl.jobs.cost_report`
``asyncrl cost report`` / ``estimate``. On the top floor, with the entry points
(docs/architecture.md#floors): a role package keeps only what runs in its process."""
