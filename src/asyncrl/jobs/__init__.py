"""Offline jobs: pipelines run from the command line that drive the roles or read a run directory,
but are no role themselves (the training job, its summary, the warm start, replay, credit inspection
and ablation, the report, run listings, cost reports). On the top floor, with the entry points
(docs/architecture.md#floors): a role package keeps only what runs in its process."""
