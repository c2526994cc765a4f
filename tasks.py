"""Invoke looks for tasks.py at the repository root; the tasks themselves live in the package."""
from provision.tasks import ns

__all__ = ["ns"]
