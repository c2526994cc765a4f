"""The endpoints' router from the controller: drain a replica before its restart, put it back after, and
read which replicas the router sends to. Each call runs provision/host/router.py on the router host
(over the run's SSH connection to it), which speaks HAProxy's runtime API on its local UNIX socket.

    drain(runner, plan, cluster, on_progress) -> int|None  no new requests; those in flight finish (bounded)
    restore(runner, plan, cluster, timeout)  -> float       back in, once its health check passes
    servers(runner)                          -> list[dict]  every replica as the router sees it now
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from provision import programs
from provision.endpoints import ADMIN_SOCKET, EndpointPlan
from provision.errors import ProvisionError
from provision.runner import Runner


def _run(runner: Runner, spec: Mapping[str, Any], timeout: float,
         on_progress: Callable[[dict[str, Any]], None] = lambda event: None) -> dict[str, Any]:
    program = programs.ship(("router",), "router_main", {"socket": ADMIN_SOCKET, **spec})
    answer, done = programs.run(runner, program, timeout + 30, lambda event: on_progress(event)
                                if event.get("event") == "progress" else None)
    if not answer:
        raise ProvisionError(f"{runner.host}: no answer from the router (exit {done.exited}): {programs.tail(done)}")
    if answer.get("error") and not answer.get("not_running"):
        raise ProvisionError(f"{runner.host}: router: {answer['error']}")
    return answer


def drain(runner: Runner, plan: EndpointPlan, cluster: str,
          on_progress: Callable[[dict[str, Any]], None] = lambda event: None) -> int | None:
    """Take `cluster`'s server out of the endpoint: no new requests; the router waits up to the
    endpoint's drain_timeout for those in flight, then holds it in maintenance. The requests still in
    flight when the timeout passed (the restart cuts them); None where no router runs yet (its first
    deploy starts it): nothing reaches the server through it to drain."""
    answer = _run(runner, {"action": "drain", "backend": plan.backend_of(cluster).name, "server": cluster,
                           "timeout": plan.drain_timeout, "poll": 0.2}, plan.drain_timeout, on_progress)
    if answer.get("not_running"):
        return None
    return int(answer.get("in_flight_left") or 0)


def restore(runner: Runner, plan: EndpointPlan, cluster: str, timeout: float = 60.0) -> float:
    """Put `cluster`'s server back; seconds until the router's health check passed on it."""
    answer = _run(runner, {"action": "ready", "backend": plan.backend_of(cluster).name, "server": cluster,
                           "timeout": timeout, "poll": 0.2}, timeout)
    if answer.get("not_running"):
        raise ProvisionError(f"{runner.host}: endpoint {plan.name}: its router does not run ({answer['error']})")
    if not answer.get("up"):
        raise ProvisionError(f"{runner.host}: endpoint {plan.name}: {cluster} is back in the router, and its "
                             f"health check has not passed in {timeout:.0f} s (state {answer.get('state')})")
    return float(answer.get("waited_s") or 0.0)


def servers(runner: Runner) -> list[dict[str, Any]]:
    """Every server of every backend as the router sees it: backend, server, address, state, in_flight."""
    answer = _run(runner, {"action": "state"}, 20.0)
    if answer.get("not_running"):
        raise ProvisionError(f"{runner.host}: router: {answer['error']}")
    return list(answer.get("servers") or [])
