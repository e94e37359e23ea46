"""One error base class and one exit-code table for every ``fleetops`` command."""

from __future__ import annotations

from fleetops import model

# The exit codes of every ``fleetops`` command (documented in the README and docs/reference).
EXIT_OK = 0
EXIT_WARN = 1  # audit: warnings; job: verdicts; actions: the action failed or was refused
EXIT_CRIT = 2  # audit: critical findings; rollout: the run itself failed
EXIT_UNKNOWN = 3  # audit: an unreachable host, or only unknowns; job: a node not asked
EXIT_USAGE = 4  # usage or input error: nothing was done (job: also the job on no node)
EXIT_INTERRUPTED = 130  # Ctrl-C

# The audit's exit code for the worst health level it found (model.HEALTH_ORDER, best to worst:
# ok, unknown, warn, crit, unreachable). The codes are not in rank order (3 serves both unknown
# and unreachable); which one wins is the order's: an unreachable host exits 3 whatever else the
# audit found, a warning beats unknowns.
AUDIT_EXIT: dict[str, int] = {
    "ok": EXIT_OK,
    "unknown": EXIT_UNKNOWN,
    "warn": EXIT_WARN,
    "crit": EXIT_CRIT,
    model.UNREACHABLE: EXIT_UNKNOWN,
}


class FleetopsError(Exception):
    """Base of every error a front end shows the operator: a message naming the file, host or
    field, and the exit code the command ends with."""

    exit_code = EXIT_WARN

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(FleetopsError):
    """Bad input (flags, inventory, baseline, selector): refused before anything acts."""

    exit_code = EXIT_USAGE


class Refused(FleetopsError):
    """A precondition failed: the action was not sent."""

    exit_code = EXIT_WARN
