"""Engines: the program that serves the model (vLLM, TensorRT-LLM, llama.cpp's server).

The `engine` setting picks one per cluster or host. What an engine is (its name, package, units, owned
flags, metrics) is its entry in provision/catalog.py; what it does lives in its module here, NAME.py
for each catalog name, whose `ENGINE` is the engine, and in its templates: the server's arguments, units
and environment, the engine's own gate verdicts (supported GPUs and quantizations, multi-node launch,
API key). Render, plan, deploy, status and the gate ask the engine and otherwise run the same path for
all of them.

    engine_of(settings) -> Engine        the engine a host's settings name
    ENGINES                              every engine, by name (the catalog's order)
    dists()                              the distributions that stand for the engines in a venv
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping

from provision import catalog, contracts
from provision.catalog import MetricNames, owned_flag
from provision.engines.base import Engine, Verdict


def _module_engine(name: str) -> Engine:
    """The engine of provision/engines/NAME.py (its `ENGINE`), checked against its catalog entry."""
    engine = importlib.import_module(f"provision.engines.{name}").ENGINE
    if not isinstance(engine, Engine) or engine.entry is not catalog.ENGINES[name]:
        raise TypeError(f"provision/engines/{name}.py: ENGINE is not the catalog's {name}")
    return engine


ENGINES: Mapping[str, Engine] = {name: _module_engine(name) for name in catalog.NAMES}
NAMES = catalog.NAMES


def dists() -> tuple[str, ...]:
    """The distributions that stand for an engine in a venv, every engine's (the contract table's
    `packages`): the venv fact reads their own requirements, the gate judges the serving engine's."""
    table = contracts.load()
    return tuple(dist for name in NAMES for dist in table.engines[name].packages)


def engine_of(settings: object) -> Engine:
    """The engine the (validated) settings name."""
    return ENGINES[catalog.entry(getattr(settings, "engine", None)).name]


__all__ = ["ENGINES", "NAMES", "Engine", "MetricNames", "Verdict", "dists", "engine_of", "owned_flag"]
