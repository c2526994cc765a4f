"""Invoke looks for tasks.py at the repository root; the tasks themselves live in the package."""
from provision.cli import ns

__all__ = ["ns"]
