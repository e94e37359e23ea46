"""Remediation: GPU resets and plans from audit findings (controller side)."""
