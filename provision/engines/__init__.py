"""Engines: the program that serves the model (vLLM, TensorRT-LLM, llama.cpp's server).

The `engine` setting picks one per cluster or host. Everything that differs between engines lives in
its module here and in its templates: the server's arguments, units and environment, the metric names
status and bench read, the file format of the weights, and the engine's own gate verdicts (supported
GPUs and quantizations, multi-node launch, API key). Render, plan, deploy, status and the gate ask the
engine and otherwise run the same path for all of them.

    engine_of(settings) -> Engine        the engine a host's settings name
    ENGINES                              every engine, by name
    MANAGED_UNITS                        every unit any engine renders (a switch stops and removes the old)
"""
from __future__ import annotations

from collections.abc import Mapping

from provision.engines.base import Engine, MetricNames, Verdict
from provision.engines.llamacpp import LLAMACPP
from provision.engines.trtllm import TRTLLM
from provision.engines.vllm import VLLM
from provision.facts import MANAGED_UNITS

ENGINES: Mapping[str, Engine] = {engine.name: engine for engine in (VLLM, TRTLLM, LLAMACPP)}
NAMES = tuple(ENGINES)

# facts.MANAGED_UNITS is what the probe reads; every engine's units must be among them.
assert {unit for engine in ENGINES.values() for unit in engine.units} <= set(MANAGED_UNITS)


def engine_of(settings: object) -> Engine:
    """The engine the (validated) settings name."""
    return ENGINES[str(getattr(settings, "engine", "vllm") or "vllm")]


__all__ = ["ENGINES", "NAMES", "Engine", "MetricNames", "Verdict", "engine_of"]
