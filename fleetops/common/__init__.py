"""Vocabulary every side of fleetops speaks: the exit codes and error base classes of every
command (``errors``) and the one rule for naming a GPU (``selectors``). Node side: the agent and
the controller both import it, so it imports nothing but ``fleetops.model`` (docs/architecture.md)."""
