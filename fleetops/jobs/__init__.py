"""Jobs on a node: which Slurm job holds which GPU (or MIG instance), from when to when, and why a
job is slow.

``record`` is the on-node record the Slurm prolog writes (``fleetops-agent job start``), the
epilog closes (``job end``) and the daemon reads each tick; ``resolve`` turns Slurm's view of a
job's GPUs (gres ids, gres.conf device files, nvidia-caps minors) into GPU and MIG UUIDs, by
device minor number, never by index; ``diagnose`` judges a job from its GPUs' samples (pure).
Standard library, ``model``, ``common`` and ``catalog`` only: this runs in a prolog, on every job
start.
"""
