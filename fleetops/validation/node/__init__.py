"""``fleetops-agent validate``: short workloads that measure each GPU, recorded with the
clocks, power and temperatures seen while they ran. It never changes a GPU setting."""
