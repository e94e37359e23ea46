"""The snapshot schema's identity, in a module of its own so the agent's fastest path (the
simulator with nothing to report) can name it without building the model's dataclasses."""

SCHEMA_VERSION = 1
SCHEMA_ID = f"fleetops.snapshot/v{SCHEMA_VERSION}"
