"""Programs that run ON a host. Each is sent as source on stdin to the host's python3 (never installed
there), preceded by common.py, by one function: provision.programs.ship. Standard library only.

The probe (with gguf.py, its GGUF header reader) and common.py run on any python3 >= 3.6: the probe
is what tells the gate which python3 a host has, so it must answer on one the gate then refuses; they
annotate with typing's names. The other
programs run on python3 >= 3.7 with `from __future__ import annotations` (PEP 585/604 annotations,
never evaluated); the gate asks 3.10 of a host for vLLM anyway. ruff checks them against 3.7
(pyproject.toml). Their `from provision.host.X import ...` lines are for the controller's tests, which
import them as modules; ship() drops those lines, since what they name comes earlier in the text."""
