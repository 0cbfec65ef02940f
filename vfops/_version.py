"""The package version, declared once: ``pyproject.toml`` reads it from here.

A literal rather than ``importlib.metadata.version("vfops")``: that lookup scans
the installed distributions (~20-40 ms of every command's start-up).
"""

__version__ = "0.1.0"
