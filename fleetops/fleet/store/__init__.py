"""The controller's history in SQLite: every audit with each node's snapshot and findings, the
``fleetops validate`` runs, every drain and resume fleetops made in Slurm, and every action taken
from the TUI with its outcome. Three modules, one concern each:

- ``database``: ``Store``, the history opened: writing (one transaction per audit), reading
  (previous snapshots, diffs, timelines, validations), retention (pruning on write, incremental
  vacuum); ``escalations`` and ``parse_since`` over it.
- ``layout``: the file: where it lives (``default_path``), its tables and layout versions, the
  migrations that bring an older file forward, how snapshots are encoded; ``StoreError``.
- ``rows``: the row types it reads and writes (``AuditRow``, ``DrainRow``, ``ActionRow``, ...).

Callers import from the module that holds a name; this package imports nothing.
"""
