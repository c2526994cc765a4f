"""What the gate, the renderer and the reports look at for one host: its settings and profile, its facts, its
cluster's other nodes and what the hub said about its model. Built once per run (provision.run), read by
checks (the gate), render, nccl and report; it depends on none of them."""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provision import catalog, contracts, services
from provision import cuda as cuda_builds
from provision.endpoints import EndpointPlan, plans_for
from provision.facts import CUDA_PTXAS, HostFacts
from provision.inventory import Cluster, Inventory, Prometheus, Settings
from provision.parsers import Gpu
from provision.profiles import Profile

# Where Triton reads the ptxas it assembles with: below arch 100, and from 3.6 at and above it (the
# contract table, engine triton).
TRITON_PTXAS_VARIABLES = ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH")
# config.json's names for an MoE model's routed experts (kvcache reads them too).
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
NVLS_HANG_ISSUE = "known.nccl-nvls-moe-hang"  # provision/known_issues.yaml


@dataclass(frozen=True)
class Context:
    """What a rule may look at: one host, its settings and profile, and its cluster's other nodes."""

    host: str
    profile: Profile
    settings: Settings
    facts: HostFacts
    cluster: Cluster | None = None
    peers: Mapping[str, HostFacts] = field(default_factory=dict)  # every node's facts, this one included
    head_address: str | None = None
    weights_bytes: int | None = None  # from hub metadata where known
    weights_to_fetch: int | None = None  # bytes this host still lacks (hub metadata and its manifest)
    snapshot: Any = None  # weights.Snapshot: the model's files at its resolved commit
    snapshot_error: str | None = None  # why the hub could not say (gated, unknown repo or revision)
    hub_unreachable: bool = False  # snapshot_error is no answer from the hub at all (network, proxy)
    api_key_set: bool = False  # a api_key is in the secrets
    # The torch of the wheels a planned venv install brings (plan time): it replaces the venv's.
    planned_wheels: cuda_builds.WheelCuda | None = None
    # The names of the wheels the service venv is made of, resolved on the controller (plan time);
    # None where the tool resolves none (no engine_spec, or a source build not yet built).
    resolved_wheels: tuple[str, ...] | None = None
    # The next apply (re)builds the service venv from resolved_wheels (their key is not the one the
    # venv's manifest holds): the venv there now is not what will serve.
    venv_rebuilt: bool = False
    # The model's config.json at its resolved commit, and its quantization_config.quant_method ("none":
    # not quantized); None where the hub was not asked or refused.
    model_config: Mapping[str, Any] | None = None
    quantization: str | None = None
    # Where model_config and weights_bytes came from when not from the fetch's hub answer (weights
    # placed by hand: the host's model directory, or the hub for a repository id), and why the model's
    # config.json is unknown where it is (said in the memory fit instead of nothing).
    model_config_from: str | None = None
    weights_from: str | None = None
    model_config_note: str | None = None
    mpi_key_set: bool = False  # an mpi_ssh_key is in the secrets (multi-node TensorRT-LLM)
    # The endpoints whose router runs on this host, and the one this host's server is behind.
    endpoints: tuple[EndpointPlan, ...] = ()
    behind: EndpointPlan | None = None
    # Where this server's units, environment and generations live on the host (services.py), and the
    # settings of the host's other services (the gate judges GPUs, ports and memory across them).
    naming: services.Naming = services.HOST
    siblings: Mapping[str, Settings] = field(default_factory=dict)
    # The inventory file that defines the host ("built-in": `--host local` without one): where a
    # missing setting is to be written, for a fix that names it.
    source: str | None = None
    # The inventory's Prometheus where it runs on this host (provision/metrics.py).
    prometheus: Prometheus | None = None

    @property
    def parallel(self) -> int:
        return int(self.settings.tensor_parallel_size) * int(self.settings.pipeline_parallel_size)

    @property
    def nodes(self) -> int:
        return len(self.cluster.hosts) if self.cluster else 1

    @property
    def visible_gpus(self) -> tuple[Gpu, ...]:
        """The GPUs this server may see: all of the host's, narrowed by CUDA_VISIBLE_DEVICES (a
        service's `gpus`) as CUDA reads it: up to the first entry that names no GPU."""
        return visible(self.facts.gpus or (), self.env("CUDA_VISIBLE_DEVICES"))

    @property
    def server_gpus(self) -> tuple[Gpu, ...]:
        """The GPUs this host's share of the server runs on: the first TP x PP / nodes of those it may
        see. CUDA_VISIBLE_DEVICES in the environment setting (indices or GPU-UUID prefixes, read as
        CUDA reads it: up to the first entry that names no GPU) narrows them; nvidia-smi's order is
        taken as CUDA's, which holds for GPUs of one model (CUDA orders by speed, then PCI bus)."""
        return tuple(self.visible_gpus[:max(1, self.parallel // self.nodes)])

    @property
    def is_head(self) -> bool:
        """Serves the API: a single host, or the head of a multi-node cluster."""
        return not (self.cluster and self.cluster.multi_node) or self.cluster.head == self.host

    @property
    def cluster_head(self) -> str:
        return self.cluster.head if self.cluster else self.host

    @property
    def cluster_order(self) -> tuple[str, ...]:
        """The cluster's nodes, the head first."""
        if not self.cluster:
            return (self.host,)
        return (self.cluster.head, *(name for name in self.cluster.hosts if name != self.cluster.head))

    @property
    def link(self) -> NodeLink | None:
        """This node's interface and address on the cluster network; None on a single host."""
        if not (self.cluster and self.cluster.multi_node):
            return None
        return link_of(self.facts, cluster_network_of(self))

    @property
    def cluster_addresses(self) -> dict[str, str]:
        """Each node's address on the cluster network, where its facts show one."""
        network = cluster_network_of(self)
        found = {}
        for name, node_facts in self.peers.items():
            link = link_of(node_facts, network)
            if link is not None:
                found[name] = link.address
        return found

    @property
    def head_cluster_address(self) -> str | None:
        return self.cluster_addresses.get(self.cluster_head)

    @property
    def host_keys(self) -> dict[str, str]:
        """Each node's SSH host key (ed25519), "TYPE BASE64", from the file its probe read."""
        keys = {}
        for name, node_facts in self.peers.items():
            text = str(node_facts.files.get(HOST_KEY, {}).get("content") or "").split()
            if len(text) >= 2 and text[0].startswith("ssh-"):
                keys[name] = f"{text[0]} {text[1]}"
        return keys

    @property
    def environment(self) -> dict[str, str]:
        """The service environment the settings give this host: the profile's and the inventory's, less
        the profile's own Triton ptxas paths where this host's toolkit ptxas cannot assemble for its GPU.
        Triton >= 3.6 tries the binary a variable names and falls back to its bundled ptxas-blackwell
        (knobs.py env_nvidia_tool.transform), so a missing one costs nothing, but an old one that runs
        is used and fails on the arch; below 3.6 the gate blocks without a toolkit ptxas either way."""
        environment = {str(name): str(value) for name, value in self.settings.environment.items()}
        if not self.toolkit_ptxas_fits:
            for name in TRITON_PTXAS_VARIABLES:
                if environment.get(name) == self.profile.environment.get(name) == CUDA_PTXAS:
                    del environment[name]
        if self.nvls_hang_possible:  # the inventory's own value stands (the known issue judges it)
            environment.setdefault("NCCL_NVLS_ENABLE", "0")
        return environment

    @property
    def planned_nccl(self) -> str | None:
        """The nvidia-nccl wheel's version among the planned wheels ('2.30.4'), None where none is planned."""
        for name in self.resolved_wheels or ():
            parts = name.split("-")
            if len(parts) >= 3 and re.fullmatch(r"nvidia_nccl_cu\d+", parts[0].lower()):
                return parts[1]
        return None

    @property
    def pinned_stack(self) -> dict[str, str]:
        """torch and nvidia_nccl_cu13 as engine_spec's exact pins bring them through the contract table's
        dependency rows ('vllm==0.34.0' -> torch 2.14.0 -> nvidia-nccl-cu13 2.30.7), known before pip
        resolves the wheels. Those rows are PyPI's CUDA wheels: on a host without a GPU (a CPU torch),
        or resolving from other indexes (PyTorch's per-CUDA builds pin their own NCCL), {}."""
        settings = self.settings
        if self.profile.gpu is None or settings.pip_index_url or settings.pip_extra_index_urls:
            return {}
        return contracts.load().pinned_stack(settings.engine_spec)

    @property
    def pinned_nccl(self) -> str | None:
        """The nvidia-nccl the exact pins of engine_spec bring (pinned_stack); None where none is known."""
        return self.pinned_stack.get("nvidia_nccl_cu13")

    @property
    def nccl_release(self) -> str | None:
        """The NCCL the server will load: the planned wheels' nvidia-nccl, else the one engine_spec's
        pins bring (what the next apply installs), else the venv's torch's."""
        return self.planned_nccl or self.pinned_nccl or (self.facts.venv.nccl if self.facts.venv else None)

    @property
    def experts(self) -> int | None:
        """The model's routed experts (config.json; a multimodal config's text_config), 0 for a dense
        model, None where the config is unknown."""
        if self.model_config is None:
            return None
        nested = self.model_config.get("text_config")
        text = nested if isinstance(nested, Mapping) else self.model_config
        found = [text.get(key) for key in EXPERT_KEYS]
        return next((value for value in found if isinstance(value, int) and value > 0), 0)

    @property
    def nvls_hang_possible(self) -> bool:
        """NCCL from 2.30.4 can hang an MoE model's weight loading across GPUs in its NVLS path, on
        hardware without NVLink too, unless NCCL_NVLS_ENABLE=0 (known.nccl-nvls-moe-hang, whose `when`
        holds the range). An unknown model counts as MoE: NVLS off costs some all-reduce speed on
        NVSwitch systems, the hang costs the server."""
        from provision import known_issues

        release = self.nccl_release
        if not catalog.entry(self.settings.engine).uses_nccl or self.parallel < 2 or not release or self.experts == 0:
            return False
        issue = next(issue for issue in known_issues.load() if issue.id == NVLS_HANG_ISSUE)
        return known_issues.version_within(release, issue.when["nccl"])

    @property
    def toolkit_ptxas_fits(self) -> bool:
        """The host's /usr/local/cuda/bin/ptxas exists and is at least the CUDA the profile's GPU needs
        (CUDA 13 for GB10's sm_121a; the bundled ptxas of Triton < 3.6 does not know it)."""
        found, needed = self.facts.ptxas_cuda, self.profile.cuda.minimum if self.profile.cuda else None
        return bool(found and needed and cuda_builds.version_tuple(found) >= cuda_builds.version_tuple(needed))

    def env(self, name: str) -> str | None:
        return self.environment.get(name)

    @property
    def extra_args(self) -> tuple[str, ...]:
        return tuple(self.settings.extra_args)


def visible(gpus: Sequence[Gpu], selection: str | None) -> tuple[Gpu, ...]:
    """The GPUs CUDA_VISIBLE_DEVICES=`selection` leaves (indices or GPU-UUID prefixes; None: all)."""
    if selection is None:
        return tuple(gpus)
    chosen: list[Gpu] = []
    for entry in (part.strip() for part in selection.split(",")):
        found = next((gpu for gpu in gpus if (entry.isdigit() and gpu.index == int(entry))
                      or (entry.startswith("GPU-") and gpu.uuid.startswith(entry))), None)
        if found is None:
            break
        chosen.append(found)
    return tuple(chosen)


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of a server argument given as `--flag VALUE` or `--flag=VALUE`; None where it is not given."""
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


HOST_KEY = "/etc/ssh/ssh_host_ed25519_key.pub"  # read with the managed files: mpirun checks host keys


@dataclass(frozen=True)
class NodeLink:
    interface: str
    address: str


def link_of(host_facts: HostFacts, network: ipaddress.IPv4Network | ipaddress.IPv6Network | None) -> NodeLink | None:
    """A host's interface and address on `network`."""
    if network is None:
        return None
    for interface in host_facts.interfaces or ():
        for address in interface.addresses:
            parsed = ipaddress.ip_interface(address)
            if parsed.ip in network:
                return NodeLink(interface.name, str(parsed.ip))
    return None


def cluster_network_of(ctx: Context) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    if ctx.settings.cluster_network:
        return ipaddress.ip_network(ctx.settings.cluster_network)
    head = ctx.peers.get(ctx.cluster.head) if ctx.cluster else None
    if head is None or ctx.head_address is None:
        return None
    for interface in head.interfaces or ():
        for address in interface.addresses:
            if address.split("/")[0] == ctx.head_address:
                return ipaddress.ip_interface(address).network
    return None


def contexts(inventory: Inventory, facts: Mapping[str, HostFacts], overrides: Mapping[str, Any],
             profile: Profile | None = None, weights_bytes: int | None = None,
             settings: Mapping[str, Settings] | None = None) -> dict[str, Context]:
    """A Context for every host with facts, its cluster peers' facts attached; its settings those the
    run resolved (`settings`), else resolved here."""
    result = {}
    for name, host_facts in facts.items():
        cluster = inventory.cluster_of(name)
        peers = {member: facts[member] for member in cluster.hosts if member in facts} if cluster else {}
        head_address = inventory.host(cluster.head).address if cluster else None
        routed, behind = plans_for(inventory, name, settings or {}, inventory.settings)
        siblings = {sibling: settings[sibling] if settings and sibling in settings else inventory.settings(sibling)
                    for sibling in inventory.siblings(name)}
        result[name] = Context(host=name, profile=profile or inventory.host(name).profile,
                               settings=settings[name] if settings and name in settings
                               else inventory.settings(name, overrides, profile=profile),
                               facts=host_facts, cluster=cluster, peers=peers, head_address=head_address,
                               weights_bytes=weights_bytes, endpoints=routed, behind=behind,
                               naming=inventory.naming(name), siblings=siblings,
                               source=inventory.host(name).source,
                               prometheus=inventory.prometheus if inventory.prometheus
                               and inventory.prometheus.host == name else None)
    return result
