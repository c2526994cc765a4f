"""Programs that run ON a host. Each is sent as source on stdin to the host's python3 (never installed
there), preceded by common.py, by one function: provision.programs.ship. Standard library only, Python
3.6+ (a host's own python3). Their `from provision.host.X import ...` lines are for the controller's tests,
which import them as modules; ship() drops those lines, since what they name comes earlier in the text."""
