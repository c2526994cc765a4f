"""Provision vLLM servers on NVIDIA hosts over SSH: inventory -> facts -> checks -> plan -> apply -> report."""
from __future__ import annotations

__version__ = "0.1.0"

from provision.errors import (
    CommandFailed,
    InventoryError,
    ParseError,
    ProvisionError,
    UnreachableHost,
)

__all__ = [
    "CommandFailed",
    "InventoryError",
    "ParseError",
    "ProvisionError",
    "UnreachableHost",
    "__version__",
]
