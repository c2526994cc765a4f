"""Invoke looks for tasks.py at the repository root; the tasks themselves live in the package. Loaded by
Invoke's own `invoke`, it hands the command line to the tool's program (provision.cli.take_over_invoke):
the same usage errors (exit 2), help and refusals as the installed `provision`."""
from provision.cli import ns, take_over_invoke

__all__ = ["ns"]

take_over_invoke()
