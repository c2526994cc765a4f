"""Render the files a host should have (units and environment) from settings, profile and facts. Pure.

Templates (templates/, Jinja2 with StrictUndefined) hold no logic beyond loops and conditionals: every
value they print is decided here, and quoted here for systemd.
"""
from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provision import affinity, hardening
from provision.context import Context, cluster_network_of
from provision.errors import ProvisionError
from provision.inventory import Settings

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable


def _templates() -> Traversable:
    """The templates as package data: templates/ at the top of the repository is the package
    provision.templates of a wheel or an editable install (pyproject.toml maps it). A checkout run
    without installing it (an older install on the path) reads the folder itself."""
    try:
        return resources.files("provision.templates")
    except ModuleNotFoundError:
        folder = Path(__file__).resolve().parents[1] / "templates"
        if not folder.is_dir():
            raise
        return folder


TEMPLATES = _templates()
UNIT_DIR = "/etc/systemd/system"
CONFIG_DIR = "/etc/vllm"
ENV_FILE = f"{CONFIG_DIR}/vllm.env"
STATE_DIR = "/var/lib/vllm"
SERVER_UNIT = "vllm.service"
RAY_HEAD_UNIT = "vllm-ray-head.service"
RAY_WORKER_UNIT = "vllm-ray-worker.service"
RAY_PORT = 6379
SUPERVISION = {"start_limit_interval_sec": 600, "start_limit_burst": 5, "restart_sec": 10}


@dataclass(frozen=True)
class DesiredFile:
    path: str
    content: str
    owner: str
    group: str
    mode: int
    restarts: tuple[str, ...] = ()  # units to restart when this file changes
    unit: bool = False  # a systemd unit file: a change needs daemon-reload


@dataclass(frozen=True)
class DesiredDir:
    path: str
    owner: str
    group: str
    mode: int


@dataclass(frozen=True)
class DesiredState:
    """What one host should have: its service user, directories, files, and units enabled and running."""

    user: str
    home: str
    directories: tuple[DesiredDir, ...]
    files: tuple[DesiredFile, ...]
    units: tuple[str, ...]  # in start order
    absent_units: tuple[str, ...]  # managed units this host must not run (e.g. a former role's)


class RenderError(ProvisionError, ValueError):
    """A template or value could not be rendered; names the template and line."""


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    # Imported on first render: status, logs and facts never render, and jinja2 (with the asyncio
    # it pulls in) is a tenth of the tool's start-up.
    import jinja2

    def source(name: str) -> str | None:  # None: jinja2 raises TemplateNotFound
        node = TEMPLATES
        for part in name.split("/"):
            node = node / part
        return node.read_text(encoding="utf-8") if node.is_file() else None

    return jinja2.Environment(loader=jinja2.FunctionLoader(source), autoescape=False,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def render(name: str, values: Mapping[str, Any]) -> str:
    import jinja2

    try:
        text: str = _environment().get_template(name).render(**values)
        return text
    except jinja2.TemplateError as exc:
        line = getattr(exc, "lineno", None)
        raise RenderError(f"{name}{f':{line}' if line else ''}: {exc}") from None


def systemd_quote(arg: str) -> str:
    """One ExecStart argument: '%' and '$' escaped, quoted when it holds spaces or quotes."""
    text = arg.replace("%", "%%").replace("$", "$$")
    if not text or any(ch in text for ch in ' \t"\'\\;'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def env_quote(value: str) -> str:
    """A value in an EnvironmentFile: double-quoted, with backslash and quote escaped."""
    if "\n" in value:
        raise RenderError(f"an environment value holds a newline: {value[:20]!r}...")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def model_path(settings: Settings) -> str:
    """Where the weights live on the host: an absolute `model` as is; a fetched one at
    MODEL_DIR/ORG/NAME/current (the verified revision, see weights.py); else MODEL_DIR/ORG/NAME."""
    model = str(settings.model or "")
    if model.startswith("/"):
        return model
    if settings.fetch_weights:
        return f"{settings.model_dir.rstrip('/')}/{model}/current"
    return f"{settings.model_dir.rstrip('/')}/{model}"


@dataclass(frozen=True)
class NodeLink:
    interface: str
    address: str


def node_link(ctx: Context) -> NodeLink | None:
    """This node's interface and address on the cluster network (multi-node only)."""
    network = cluster_network_of(ctx)
    if network is None:
        return None
    for interface in ctx.facts.interfaces:
        for address in interface.addresses:
            parsed = ipaddress.ip_interface(address)
            if parsed.ip in network:
                return NodeLink(interface.name, str(parsed.ip))
    return None


def server_args(ctx: Context, resolutions: Sequence[str]) -> list[str]:
    settings = ctx.settings
    venv = settings.venv_dir.rstrip("/")
    args = [f"{venv}/bin/python", "-m", "vllm.entrypoints.openai.api_server",
            "--model", model_path(settings),
            "--served-model-name", str(settings.served_model_name or settings.model),
            "--host", str(settings.bind_host), "--port", str(settings.port),
            "--tensor-parallel-size", str(settings.tensor_parallel_size),
            "--pipeline-parallel-size", str(settings.pipeline_parallel_size)]
    if ctx.profile.gpu is not None:
        args += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization)]
    if settings.max_model_len:
        args += ["--max-model-len", str(settings.max_model_len)]
    args.append("--enable-prefix-caching" if settings.enable_prefix_caching else "--no-enable-prefix-caching")
    if ctx.cluster and ctx.cluster.multi_node:
        args += ["--distributed-executor-backend", "ray"]
    args += [arg for arg in resolutions if arg not in settings.extra_args]
    args += list(settings.extra_args)
    return args


def service_environment(ctx: Context, api_key: str | None = None) -> list[tuple[str, str]]:
    """The EnvironmentFile's variables: the profile's and the inventory's, plus what this node needs
    (and VLLM_API_KEY, which vLLM reads, from the secrets: this file is root's, mode 0600)."""
    environment = dict(ctx.settings.environment)
    if api_key:
        environment["VLLM_API_KEY"] = api_key
    environment["HF_HOME"] = ctx.settings.hf_home
    # Unknown GPUs (gpu.present blocks on them, unless forced) keep the variable: it does no harm.
    if ctx.facts.gpus is not None and len(ctx.facts.gpus) < 2 and not (ctx.cluster and ctx.cluster.multi_node):
        environment.pop("NCCL_P2P_LEVEL", None)  # P2P settings matter only between GPUs
    if ctx.cluster and ctx.cluster.multi_node:
        link = node_link(ctx)
        if link is None:
            raise RenderError(f"{ctx.host} has no interface on the cluster network (see `invoke check`)")
        for name in ("VLLM_HOST_IP", "RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS"):
            environment[name] = link.address
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
            environment[name] = link.interface
        devices = [rdma.device for rdma in ctx.facts.rdma or () if rdma.up]
        if devices:
            environment["NCCL_IB_HCA"] = ",".join(devices)
    return sorted((name, env_quote(str(value))) for name, value in environment.items())


def desired_state(ctx: Context, resolutions: Sequence[str] = (), api_key: str | None = None) -> DesiredState:
    """Every file, directory and unit the host should have, rendered."""
    settings = ctx.settings
    user = str(settings.service_user)
    multi = bool(ctx.cluster and ctx.cluster.multi_node)
    head = not multi or (ctx.cluster is not None and ctx.cluster.head == ctx.host)
    chosen = affinity.choose(str(settings.cpu_affinity), ctx.facts.cpu, ctx.facts.unreadable, ctx.server_gpus)
    writable = sorted({STATE_DIR, settings.model_dir, settings.hf_home})
    common = {"host": ctx.host, "profile": ctx.profile.name, "user": user, "env_file": ENV_FILE,
              "state_dir": STATE_DIR, "writable_paths": writable, "hardening": hardening.unit_values(ctx),
              **SUPERVISION}
    files = [DesiredFile(ENV_FILE, render("env/vllm.env.j2", {**common, "environment": service_environment(ctx, api_key)}),
                         "root", "root", 0o600)]
    units: list[str] = []
    venv = settings.venv_dir.rstrip("/")
    if multi:
        assert ctx.cluster is not None
        link = node_link(ctx)
        assert link is not None  # service_environment refused already
        ray_unit = RAY_HEAD_UNIT if head else RAY_WORKER_UNIT
        start = ([f"{venv}/bin/ray", "start", "--block", "--head", f"--node-ip-address={link.address}",
                  f"--port={RAY_PORT}", "--dashboard-host=127.0.0.1"] if head else
                 [f"{venv}/bin/ray", "start", "--block", f"--address={ctx.head_address}:{RAY_PORT}",
                  f"--node-ip-address={link.address}"])
        content = render(f"systemd/{ray_unit}.j2", {
            **common, "cluster": ctx.cluster.name,
            "exec_start": " ".join(systemd_quote(arg) for arg in start),
            "exec_stop": f"{systemd_quote(venv + '/bin/ray')} stop"})
        files.append(DesiredFile(f"{UNIT_DIR}/{ray_unit}", content, "root", "root", 0o644,
                                 restarts=(ray_unit,), unit=True))
        units.append(ray_unit)
    if head:
        ray_after = [RAY_HEAD_UNIT] if multi else []
        content = render("systemd/vllm.service.j2", {
            **common,
            "served_model_name": str(settings.served_model_name or settings.model),
            "after": ray_after, "requires": ray_after,
            # Ray's session (/tmp/ray: the cluster's address, the local raylet's sockets) lives in
            # the head unit's private /tmp: the server joins it, or ray.init() starts a cluster of its own.
            "joins_namespace_of": ray_after,
            "exec_start": " ".join(systemd_quote(arg) for arg in server_args(ctx, resolutions)),
            "timeout_start_sec": 1800,
            "cpu_affinity": chosen.cpu_list, "affinity_reason": chosen.reason,
            "numa_mask": ",".join(map(str, chosen.numa_nodes)) if chosen.numa_nodes else None})
        files.append(DesiredFile(f"{UNIT_DIR}/{SERVER_UNIT}", content, "root", "root", 0o644,
                                 restarts=(SERVER_UNIT,), unit=True))
        units.append(SERVER_UNIT)
    # The environment feeds every unit of the host.
    files[0] = DesiredFile(ENV_FILE, files[0].content, "root", "root", 0o600, restarts=tuple(units))
    directories = (
        DesiredDir(CONFIG_DIR, "root", "root", 0o755),
        DesiredDir(STATE_DIR, user, user, 0o750),
        *(DesiredDir(path, user, user, 0o750) for path in sorted({settings.model_dir, settings.hf_home})
          if path != STATE_DIR),
    )
    managed = (SERVER_UNIT, RAY_HEAD_UNIT, RAY_WORKER_UNIT)
    return DesiredState(user=user, home=STATE_DIR, directories=directories, files=tuple(files),
                        units=tuple(units), absent_units=tuple(u for u in managed if u not in units))
