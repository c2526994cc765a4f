"""Render the files a host should have (units and environment) from settings, profile and facts. Pure.

Templates (templates/, Jinja2 with StrictUndefined) hold no logic beyond loops and conditionals: every
value they print is decided here, and quoted here for systemd.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provision import affinity, endpoints, engines, hardening, hints, serverfiles, services
from provision.context import Context
from provision.engines.llamacpp import gguf_models
from provision.engines.vllm import VLLM
from provision.errors import RenderError
from provision.facts import CUDA_PTXAS, MANAGED_UNITS
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
CONFIG_DIR = services.CONFIG_DIR
ENV_FILE = services.HOST_ENV_FILE  # a host without services; a service's is services.Naming.env_file
STATE_DIR = "/var/lib/vllm"
SERVER_UNIT = VLLM.server_unit  # vLLM's; each engine names its own (engines.engine_of(settings).server_unit)
# Restart=always, not on-failure: a server that exits on its own is an outage whatever its status, and
# vLLM's API server exits with status 0 when its engine process dies (a SIGILL in the engine read so).
SUPERVISION = {"start_limit_interval_sec": 600, "start_limit_burst": 5, "restart_sec": 10, "restart": "always",
               "restart_reason": None}


@dataclass(frozen=True)
class DesiredFile:
    path: str
    content: str
    owner: str
    group: str
    mode: int
    restarts: tuple[str, ...] = ()  # units to restart when this file changes
    reloads: tuple[str, ...] = ()  # units that re-read it on `systemctl reload` (and keep what they hold)
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
    absent_units: tuple[str, ...]  # managed units this host must not run (a former role's or engine's)
    absent_files: tuple[str, ...] = ()  # managed files this host must not have (removed where found)
    shell: str = "/usr/sbin/nologin"  # the service user's login shell
    server_unit: str | None = None  # the unit serving the API here (None on a worker)
    # A unit this server replaces under another name (a host that declares services now): {old: new}.
    renamed: Mapping[str, str] = field(default_factory=dict)


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
        raise RenderError(f"{name}{f':{line}' if line else ''}: {exc}") from exc


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


def model_file(ctx: Context) -> str:
    """What the server loads: the weights' directory, or for a one-file engine (llama.cpp's GGUF) the file
    in it: the first part of a split file, the only model file of the fetched snapshot otherwise."""
    path = model_path(ctx.settings)
    if engines.engine_of(ctx.settings).model_format != "gguf" or path.endswith(".gguf"):
        return path
    firsts = gguf_models([f.path for f in ctx.snapshot.files] if ctx.snapshot else [])
    if not firsts:  # placed by hand: model_files names the file
        firsts = gguf_models([pattern for pattern in ctx.settings.model_files if "*" not in pattern])
    if len(firsts) != 1:
        found = ", ".join(firsts[:4]) or "none"
        raise RenderError(f"{ctx.host}: llama.cpp serves one GGUF file; the model offers {len(firsts)} ({found}): "
                          "narrow model_files to one (e.g. ['*Q4_K_M.gguf'])")
    return f"{path}/{firsts[0]}"


CUDA_BIN = CUDA_PTXAS.rsplit("/", 1)[0]  # where the probe finds ptxas (facts.ptxas_cuda)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # systemd's own for services


def service_environment(ctx: Context, api_key: str | None = None) -> list[tuple[str, str]]:
    """The EnvironmentFile's variables: the profile's and the inventory's, plus what this node and its
    engine need (and the API key under the name the engine reads, from the secrets: this file is
    root's, mode 0600)."""
    engine = engines.engine_of(ctx.settings)
    environment = ctx.environment
    if api_key and engine.api_key_variable:
        environment[engine.api_key_variable] = api_key
    environment["HF_HOME"] = ctx.settings.hf_home
    # What the server runs by name at start: FlashInfer's JIT (vLLM's sampler, first used while the engine
    # starts) runs `ninja` from the venv and CUDA's `nvcc`. systemd's own PATH holds neither: on the lent
    # H100, vLLM 0.26.0 died at start with "No such file or directory: 'ninja'".
    environment.setdefault("PATH", ":".join([f"{ctx.settings.venv_dir.rstrip('/')}/bin",
                                             *([CUDA_BIN] if ctx.facts.ptxas_cuda else []), SYSTEM_PATH]))
    # Unknown GPUs (gpu.present blocks on them, unless forced) keep the variable: it does no harm.
    if ctx.facts.gpus is not None and len(ctx.facts.gpus) < 2 and not (ctx.cluster and ctx.cluster.multi_node):
        environment.pop("NCCL_P2P_LEVEL", None)  # P2P settings matter only between GPUs
    if ctx.cluster and ctx.cluster.multi_node:
        link = ctx.link
        if link is None:
            raise RenderError(f"{ctx.host} has no interface on the cluster network "
                              f"(see `{hints.command('check')}`)")
        devices = [rdma.device for rdma in ctx.facts.rdma or () if rdma.up]
        if devices:
            environment["NCCL_IB_HCA"] = ",".join(devices)
    environment = engine.environment(ctx, environment)
    return sorted((name, env_quote(str(value))) for name, value in environment.items())


def _unit_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """An engine's unit values with each exec_* argv list as one quoted ExecStart=/ExecStop= line."""
    return {key: " ".join(systemd_quote(arg) for arg in value) if key.startswith("exec_") and isinstance(value, list)
            else value for key, value in values.items()}


def managed_paths(home: str = STATE_DIR) -> tuple[str, ...]:
    """Every file any engine renders on a host without services: a generation records each one, present
    or absent."""
    units = tuple(f"{UNIT_DIR}/{unit}" for unit in MANAGED_UNITS)
    configs = tuple(path for engine in engines.ENGINES.values() for path in engine.config_paths(home))
    return (ENV_FILE, *units, *configs, endpoints.CONFIG_FILE, endpoints.KEYS_FILE)


SERVER_UNITS = tuple(engine.server_unit for engine in engines.ENGINES.values())  # what a service may run


def service_units(naming: services.Naming) -> tuple[str, ...]:
    """The units a server of these names may have: a service's, one per engine (single-node only); the
    host's own names' otherwise."""
    return MANAGED_UNITS if naming.service is None else naming.units(SERVER_UNITS)


def managed_paths_of(naming: services.Naming, home: str = STATE_DIR) -> tuple[str, ...]:
    """The files a server of these names owns (and its generations record): a service's environment
    file and units, and where it carries the host's own names, theirs too."""
    if naming.service is None:
        return managed_paths(home)
    own = (naming.env_file, *(f"{UNIT_DIR}/{unit}" for unit in service_units(naming)))
    return (*own, *managed_paths(home)) if naming.carrier else own


def units_of(naming: services.Naming) -> tuple[str, ...]:
    """The units a server's generations record: its own, and the host's where it carries those."""
    if naming.service is None:
        return MANAGED_UNITS
    return (*service_units(naming), *MANAGED_UNITS) if naming.carrier else service_units(naming)


def stale_services(ctx: Context) -> dict[str, str]:
    """Units of services the host still has that the inventory no longer declares ({unit: service}):
    a host without services (or a service carrying the host's names) removes them."""
    if not ctx.naming.carrier:
        return {}
    found = services.service_units_in(ctx.facts.dirs.get(UNIT_DIR) or (), SERVER_UNITS)
    declared = {ctx.naming.service, *(services.split(name)[1] for name in ctx.siblings)}
    return {unit: service for unit, service in found.items() if service not in declared}


def router_config(host: str, plans: Sequence[endpoints.EndpointPlan], *, keys: bool,
                  admin_socket: str = endpoints.ADMIN_SOCKET) -> str:
    """HAProxy's config for the endpoints `plans` whose router runs on `host`; `keys`: the API key is
    checked in front (the unit hands its file over as a credential)."""
    return render("router/haproxy.cfg.j2", {
        "host": host, "admin_socket": admin_socket, "bufsize": endpoints.buffer_size(plans),
        "headers_max": endpoints.HEADERS_MAX, "prompt_bytes": endpoints.PROMPT_PREFIX_BYTES,
        "endpoints": [{"name": plan.name, "bind": f"{plan.bind_host}:{plan.port}",
                       "metrics_bind": f"{plan.bind_host}:{plan.metrics_port}",
                       "key_file": endpoints.KEYS_CREDENTIAL if keys else None, "backends": plan.backends,
                       "models": " ".join(backend.model for backend in plan.backends),
                       "served": ", ".join(backend.model for backend in plan.backends),
                       "routing": plan.routing, "body_limit": plan.body_limit,
                       "body_limit_text": f"{plan.max_body_mb:g} MiB",
                       "request_timeout": endpoints.haproxy_time(plan.request_timeout),
                       "receive_timeout": endpoints.haproxy_time(plan.receive_timeout)}
                      for plan in plans]})


def router_files(ctx: Context, common: Mapping[str, Any], api_key: str | None) -> list[DesiredFile]:
    """The router's config, its API key file (root's alone, read by the unit as a credential) and its
    unit, for the endpoints whose router runs on this host (provision/endpoints.py)."""
    unit = endpoints.ROUTER_UNIT
    config = router_config(ctx.host, ctx.endpoints, keys=bool(api_key))
    values = {**common, "config": endpoints.CONFIG_FILE, "keys_file": endpoints.KEYS_FILE if api_key else None,
              "keys_dir": endpoints.KEYS_FILE.rsplit("/", 1)[0],
              "keys_credential": endpoints.KEYS_CREDENTIAL, "runtime_dir": endpoints.RUNTIME_DIR.rsplit("/", 1)[1],
              "endpoint_names": ", ".join(plan.name for plan in ctx.endpoints),
              "writable_paths": [endpoints.RUNTIME_DIR], "hardening": hardening.router_values(ctx)}
    # A new config is a reload: HAProxy's master starts new workers on it and the old ones finish the
    # requests they hold (a restart would cut them). The key is a credential, read at start: a restart.
    files = [DesiredFile(endpoints.CONFIG_FILE, config, "root", "root", 0o644, reloads=(unit,))]
    if api_key:
        files.append(DesiredFile(endpoints.KEYS_FILE, api_key + "\n", "root", "root", 0o600, restarts=(unit,)))
    files.append(DesiredFile(f"{UNIT_DIR}/{unit}", render("systemd/provision-router.service.j2", values),
                             "root", "root", 0o644, restarts=(unit,), unit=True))
    return files


def server_file_dirs(naming: services.Naming) -> tuple[str, ...]:
    """The folders of a server's files (server_files), outermost first: root's, mode 0755 (the service
    user reads its files through them)."""
    return (serverfiles.FILES_DIR.rsplit("/", 1)[0], serverfiles.FILES_DIR, serverfiles.host_dir(naming.service))


def placed_server_files(ctx: Context) -> tuple[Context, list[DesiredFile]]:
    """The files server_files gives (each read from the controller: root's, 0644, in the server's folder
    of serverfiles.FILES_DIR), and the context whose server_flags name each flag with its path there, so
    every engine's command line says `FLAG HOSTPATH` (in place of the flag in server_flags or extra_args).
    RenderError: a file a recipe needs that is not given (image:PATH), two of one name, one unreadable."""
    files = ctx.settings.server_files
    if not files:
        return ctx, []
    needed = serverfiles.needed(files)
    if needed:
        named = "; ".join(f"{flag} {path}" for flag, path in needed.items())
        raise RenderError(f"{ctx.host}: server_files names a file inside a container image, which no host has "
                          f"({named}): give each as a file on this machine ({serverfiles.set_hint(needed)}, "
                          "or in the inventory's vars)")
    for name, first, second in serverfiles.clashes(files):
        raise RenderError(f"{ctx.host}: server_files {first} and {second} both give a file named {name}: one "
                          f"host path ({serverfiles.host_dir(ctx.naming.service)}/{name}); rename one")
    paths = serverfiles.host_paths(files, ctx.naming.service)
    placed = []
    for flag, local in files.items():
        try:
            content = serverfiles.read_local(local)
        except (OSError, ValueError) as exc:
            raise RenderError(f"{ctx.host}: server_files {flag}: {exc}") from exc
        placed.append(DesiredFile(paths[flag], content, "root", "root", 0o644))
    settings = dataclasses.replace(ctx.settings, server_flags={**ctx.settings.server_flags, **paths})
    return dataclasses.replace(ctx, settings=settings), placed


def desired_state(ctx: Context, resolutions: Sequence[str] = (), api_key: str | None = None,
                  secrets: Mapping[str, str | None] | None = None) -> DesiredState:
    """Every file, directory and unit the host should have, rendered; `secrets` by their secrets-file
    names (an engine's files may hold one: the MPI key of a TensorRT-LLM cluster)."""
    ctx, given = placed_server_files(ctx)
    settings = ctx.settings
    engine = engines.engine_of(settings)
    naming = ctx.naming
    env_file = naming.env_file
    user = str(settings.service_user)
    chosen = affinity.choose(str(settings.cpu_affinity), ctx.facts.cpu, ctx.facts.unreadable, ctx.server_gpus)
    writable = sorted({STATE_DIR, settings.model_dir, settings.hf_home})
    common = {"host": ctx.host, "profile": ctx.profile.name, "user": user, "env_file": env_file,
              "state_dir": STATE_DIR, "writable_paths": writable, "hardening": hardening.unit_values(ctx),
              **SUPERVISION}
    environment = service_environment(ctx, api_key)
    files = [DesiredFile(env_file, render("env/vllm.env.j2", {**common, "environment": environment}),
                         "root", "root", 0o600)]
    server = {"served_model_name": str(settings.served_model_name or settings.model), "engine": engine.title,
              "environment": [name for name, _ in environment],  # the names the environment file sets
              "model": model_file(ctx) if ctx.is_head else model_path(settings),
              "timeout_start_sec": 1800, "cpu_affinity": chosen.cpu_list, "affinity_reason": chosen.reason,
              "numa_mask": ",".join(map(str, chosen.numa_nodes)) if chosen.numa_nodes else None}
    units = []
    for unit in engine.unit_files(ctx, common, server, resolutions):
        content = render(unit.template, _unit_values(unit.values))
        name = naming.unit(unit.name)
        files.append(DesiredFile(f"{UNIT_DIR}/{name}", content, "root", "root", 0o644,
                                 restarts=(name,), unit=True))
        units.append(name)
    extra_dirs = []
    for config in engine.config_files(ctx, secrets or {}, STATE_DIR):
        owner = user if config.owner == "service" else config.owner
        content = config.content if config.content is not None else render(config.template, config.values)
        files.append(DesiredFile(config.path, content, owner, owner, config.mode, restarts=tuple(units)))
        parent = config.path.rsplit("/", 1)[0]
        if parent not in (CONFIG_DIR, STATE_DIR):
            extra_dirs.append(DesiredDir(parent, owner, owner, 0o700))
    # The environment feeds every unit of the host (the router reads none of it).
    files[0] = DesiredFile(env_file, files[0].content, "root", "root", 0o600, restarts=tuple(units))
    # The files server_files gives: read at start, so a new one restarts the server.
    files.extend(dataclasses.replace(placed, restarts=tuple(units)) for placed in given)
    if ctx.endpoints:
        files.extend(router_files(ctx, common, api_key))
        units.append(endpoints.ROUTER_UNIT)
    directories = (
        DesiredDir(CONFIG_DIR, "root", "root", 0o755),
        DesiredDir(STATE_DIR, user, user, 0o750),
        *(DesiredDir(path, user, user, 0o750) for path in sorted({settings.model_dir, settings.hf_home})
          if path != STATE_DIR),
        *extra_dirs,
        *(DesiredDir(path, "root", "root", 0o755) for path in server_file_dirs(naming) if given),
    )
    rendered = {f.path for f in files}
    stale = stale_services(ctx)
    stale_files = [f"{UNIT_DIR}/{unit}" for unit in stale] + [
        services.Naming(service).env_file for service in sorted(set(stale.values()))]
    folder = serverfiles.host_dir(naming.service)  # a file server_files no longer gives is removed
    stale_files += [f"{folder}/{name}" for name in ctx.facts.dirs.get(folder) or () if f"{folder}/{name}" not in rendered]
    server_unit = naming.unit(engine.server_unit) if ctx.is_head else None
    # The first service of a host takes over the server a host without services ran, under its own name.
    renamed = dict.fromkeys(SERVER_UNITS, server_unit) if naming.service and naming.carrier and server_unit else {}
    return DesiredState(user=user, home=STATE_DIR, directories=directories, files=tuple(files), units=tuple(units),
                        absent_units=tuple(u for u in (*units_of(naming), *stale) if u not in units),
                        absent_files=tuple(p for p in (*managed_paths_of(naming, STATE_DIR), *stale_files)
                                           if p not in rendered),
                        shell=engine.user_shell(ctx), server_unit=server_unit, renamed=renamed)
