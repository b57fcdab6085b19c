"""Engines other than speclab's own loop: how their binaries are built, started, asked and stopped."""
