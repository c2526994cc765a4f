"""Engines: the program that serves the model (vLLM, TensorRT-LLM, llama.cpp's server).

The `engine` setting picks one per cluster or host. Everything that differs between engines lives in
its module here and in its templates: the server's arguments, units and environment, the metric names
status and bench read, the file format of the weights, and the engine's own gate verdicts (supported
GPUs and quantizations, multi-node launch, API key). Render, plan, deploy, status and the gate ask the
engine and otherwise run the same path for all of them.

    engine_of(settings) -> Engine        the engine a host's settings name
    ENGINES                              every engine, by name
    dists()                              the distributions that stand for the engines in a venv
    MANAGED_UNITS                        every unit any engine renders (a switch stops and removes the old)
"""
from __future__ import annotations

from collections.abc import Mapping

from provision import contracts
from provision.engines.base import Engine, MetricNames, Verdict, flag_name
from provision.engines.llamacpp import LLAMACPP
from provision.engines.trtllm import TRTLLM
from provision.engines.vllm import VLLM
from provision.facts import MANAGED_UNITS

ENGINES: Mapping[str, Engine] = {engine.name: engine for engine in (VLLM, TRTLLM, LLAMACPP)}
NAMES = tuple(ENGINES)


def dists() -> tuple[str, ...]:
    """The distributions that stand for an engine in a venv, every engine's (the contract table's
    `packages`): the venv fact reads their own requirements, the gate judges the serving engine's."""
    table = contracts.load()
    return tuple(dist for name in NAMES for dist in table.engines[name].packages)

# facts.MANAGED_UNITS is what the probe reads; every engine's units must be among them.
assert {unit for engine in ENGINES.values() for unit in engine.units} <= set(MANAGED_UNITS)


def owned_flag(arg: str) -> str | None:
    """Where `arg` is a flag some engine's server command sets from the settings: which engine's, and
    the setting to use instead (refused in server_flags and extra_args whatever the engine: the engine
    setting may come from another layer than the flags)."""
    for engine in ENGINES.values():
        owned = engine.owned(arg)
        if owned is not None:
            flag, setting = owned
            given = arg.split("=", 1)[0]
            read_as = "" if flag_name(given) == flag else f" ({engine.title} reads it as {flag})"
            return f"{given}{read_as} is a flag the tool sets itself ({engine.title}'s): set {setting} instead"
    return None


def engine_of(settings: object) -> Engine:
    """The engine the (validated) settings name."""
    return ENGINES[str(getattr(settings, "engine", "vllm") or "vllm")]


__all__ = ["ENGINES", "NAMES", "Engine", "MetricNames", "Verdict", "dists", "engine_of", "owned_flag"]
