"""The node's network fabric: the InfiniBand / RoCE HCAs beside the GPUs, read from sysfs only.

``sysfs.read`` builds the snapshot's ``model.Fabric`` from a sysfs root (``/sys`` on a node, the
simulated node's tree in its state folder): every RDMA device under ``class/infiniband`` and
each port's state, rate, link layer and counters, the netdev, PCI function, NUMA node and
firmware, and which GPUs share its PCIe switch. No MAD, no register access (the driver's
register reads flooded the kernel log on some ConnectX-7 boards), no subprocess. Standard library
and ``model`` only: it runs in every cold collect and the daemon.
"""
