"""The run, stage by stage, for every task that changes or inspects hosts (check, plan, provision, venv,
weights; deploy adds its roll in provision.rolling):

    gating.gather(inventory, targets, options)  facts of every target, one round trip each, in parallel
    gating.gate(...)        -> Gated             each host's settings resolved once, its facts and the hub's
                                                 answers (hub) as its Context, and every rule's finding
    planning.plans(...)     -> Planned           what each host needs, rendered and diffed; blocked hosts get
                                                 none; each HostPlan carries its host's Context on
    carrying.carry_out(...)                      wheels pushed, weights fetched (the hub once per cluster), the
                                                 rest applied (or handed to deploy's roll), each host on its own
    carrying.provision(...) -> Applied           plans then carry_out, for provision, venv and weights

What a run was asked to do travels as one frozen Options (options); the task modules only parse arguments
into it and print what comes back (provision.report). Each stage reads what the one before left: after
the gate, nothing resolves a host's settings again. The names below are the ones other modules use.
"""
from __future__ import annotations

from provision.run.carrying import (
    Applied,
    Bar,
    Connect,
    Final,
    carry_out,
    generation_of,
    provision,
    remaining,
    secret_environment,
    time_left,
    weight_jobs,
    wheel_jobs,
)
from provision.run.gating import Gated, gate, gather, resolve
from provision.run.hub import HubAnswer, HubKey
from provision.run.options import Options, progress_line
from provision.run.planning import (
    HostPlan,
    Planned,
    host_plan,
    plans,
    scope_of,
    unfinished_generation,
)

__all__ = ["Applied", "Bar", "Connect", "Final", "Gated", "HostPlan", "HubAnswer", "HubKey", "Options", "Planned",
           "carry_out", "gate", "gather", "generation_of", "host_plan", "plans", "progress_line", "provision",
           "remaining", "resolve", "scope_of", "secret_environment", "time_left", "unfinished_generation",
           "weight_jobs", "wheel_jobs"]
