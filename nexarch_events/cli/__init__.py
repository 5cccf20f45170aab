"""The ``nexarch-events`` command line: one module per command group,
assembled into one parser by ``main``."""

from .app import main

__all__ = ["main"]
