"""Widgets of the fleetops TUI: the in-place table and the header line."""
