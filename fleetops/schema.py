"""The snapshot schema's identity, in a module of its own so the agent's fastest path (the
simulator with nothing to report) can name it without building the model's dataclasses."""

# Keys added as optional (null when absent) keep the version: a v1 reader fills what an older
# document lacks with None ("not collected"). NvLink.tx_kib / rx_kib came in that way.
SCHEMA_VERSION = 1
SCHEMA_ID = f"fleetops.snapshot/v{SCHEMA_VERSION}"
