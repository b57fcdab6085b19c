"""Engines other than speclab's own loop, one package each: how their binaries are built, started, asked and stopped,
and their configurations as speclab arms. May import speclab.models and speclab.specs, never the loops.
"""
