"""XIDs, the driver's reports of GPU faults, in one room (node side, standard library only).

- ``catalog``: what each XID code means, its severity and the action it calls for, SXid
  (NVSwitch) codes apart, and the recovery action XID 154 names.
- ``policy``: what the checks do beyond the catalog entry: the shipped policy for the codes the
  references disagree on and a baseline's ``xid_policy``, escalation when a code repeats on one
  GPU, how long an event's finding holds.
- ``kernlog``: the NVIDIA driver's kernel-log lines (``NVRM: Xid ...``) parsed into
  ``model.XidEvent`` from every format dmesg, journalctl and syslog print, and this boot's lines
  read with ``journalctl`` or ``dmesg`` (the cold collect).
- ``follower``: the daemon's ``/dev/kmsg`` follower with its persisted cursor and counters, and
  the pairing of one XID's two reports (kernel log and NVML event) across the printk clock's drift.

The check that turns events into findings is the ``xid`` family of ``fleetops.checks``
(``checks/xid.py``), beside every other check family; it reads this room.
"""
