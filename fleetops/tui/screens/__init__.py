"""Screens of the fleetops TUI: fleet, node detail, confirmation and help."""
