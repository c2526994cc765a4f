"""What every task shares: the common flags (declared once, parsed into one HostFlags), their help, the
mapping of errors to exit codes, logging, and turning the flags into the inventory, the targets and the
run's Options (provision.run).

    @host_task("plan", "inventory", "host", ..., help={...})
    def plan_(c: Context, flags: HostFlags, own_flag: int = 1) -> None: ...

Invoke reads a task's flags off its signature: host_task gives the task one built of the shared flags
named and the task's own parameters, and hands the body the shared ones as one HostFlags."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from invoke.exceptions import Exit
from invoke.tasks import Task
from invoke.tasks import task as invoke_task

from provision import config
from provision.errors import InventoryError, LabError, causes

if TYPE_CHECKING:  # the tasks import these where they run: `invoke --list` and -h need none of them
    from provision.inventory import Host, Inventory
    from provision.profiles import Profile
    from provision.run import Options

F = TypeVar("F", bound=Callable[..., Any])


COMMON_HELP = {
    "inventory": "inventory file or directory (default: $PROVISION_INVENTORY, else the lab's while it is up "
                 "in the checkout that brought it up or with $PROVISION_LAB=1, else ./inventory)",
    "host": "a host name from the inventory (a host with services: all of them; HOST/SERVICE: one), or 'local' for this machine (repeatable)",
    "cluster": "a cluster name from the inventory (repeatable)",
    "all": "every host of the inventory",
    "json": "print JSON for scripts instead of tables",
    "accept-new-host-keys": "trust and record the key of a host seen for the first time "
                            "(a changed key is always refused)",
    "profile": "hardware profile to assume (overrides the inventory's; useful with --host local)",
    "set": "override a service setting, KEY=VALUE (repeatable; highest precedence)",
    "verbose": "log every remote command (secrets masked) and what each host's fact probe ran, "
               "and for how long, to stderr",
    "force": "override a blocker by its check id (repeatable)",
    "wait": "seconds to wait for another run's lock on a host",
}


def help_for(*names: str, **extra: str) -> dict[str, str]:
    return {**{name: COMMON_HELP[name] for name in names}, **extra}


class KeptHelpTask(Task[Any]):
    """Invoke's Task, whose flags keep their help however often they are read. Invoke's own pops each
    flag's help out of the task as it builds the parser, so the second program a task runs over the same
    tasks (`recipe.show -h`, whose -h Invoke hands the task as its NAME: recipe_tasks._given) would list
    the flags bare."""

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Any]:
        kept = dict(self.help)
        try:
            return super().get_arguments(ignore_unknown_help)
        finally:
            self.help = kept


def task(**options: Any) -> Callable[[Callable[..., Any]], KeptHelpTask]:
    """`@task(...)`, Invoke's decorator making a KeptHelpTask: every task of this tool is declared
    through it."""
    return invoke_task(klass=KeptHelpTask, **options)


# Invoke's core options that shape what Invoke's own run() does. No task runs a command through it
# (remote.py runs every command, with its own echo, timeouts and sudo), so these would have no effect:
# `--dry deploy` would deploy. They are refused, not ignored; `provision -h` does not list them.
# (the option, the config key the checkout's `invoke` sets for it.)
UNHONOURED_CORE_OPTIONS = (("dry", ("run", "dry")), ("echo", ("run", "echo")), ("warn-only", ("run", "warn")),
                           ("pty", ("run", "pty")), ("hide", ("run", "hide")),
                           ("prompt-for-sudo-password", ("sudo", "password")),
                           ("command-timeout", ("timeouts", "command")), ("config", None))


def core_option_refused(option: str) -> str:
    """Why Invoke's --OPTION is refused, and where the tool's own dry runs are."""
    from provision import hints
    return (f"error: --{option} is Invoke's core option, not this tool's: no task runs its commands through "
            f"Invoke, so it would have no effect. A dry run here: `{hints.command('plan --all')}` (what a "
            f"deploy would change), `{hints.command('check --all')}` (the gate), or a task's own --dry-run "
            "(prepare, recipe.apply)")


def _refuse_core_options(c: Any) -> None:
    """A program other than the tool's (Tool refuses these while parsing: provision.cli) hands the task
    its core options' values in its Context's config, as Invoke's own did in a checkout before tasks.py
    handed it over: one given on the command line (the config's overrides level, not a config file of
    the user's other projects; for --config, the runtime file it names) stops the task before it starts."""
    settings = getattr(c, "config", None)
    overrides = getattr(settings, "_overrides", None)
    if not isinstance(overrides, Mapping):
        return
    for option, key in UNHONOURED_CORE_OPTIONS:
        given = (overrides.get(key[0]) or {}).get(key[1]) if key else getattr(settings, "_runtime_path", None)
        if given:
            raise Exit(core_option_refused(option), code=2)


def guarded(function: F) -> F:
    """Map the error tree to exit codes and one clear line on stderr, never a traceback; refuse
    Invoke's core options that would change nothing (`--dry`)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if args:
            _refuse_core_options(args[0])
        try:
            return function(*args, **kwargs)
        except InventoryError as exc:
            _log_causes(exc)
            raise Exit(f"error: {exc}", code=2) from None
        except LabError as exc:
            _log_causes(exc)
            raise Exit(f"lab: {exc}", code=1) from None

    return wrapper  # type: ignore[return-value]


def _log_causes(error: BaseException) -> None:
    """Under --verbose (a debug line), what the error came from; its own line, on stderr, is unchanged."""
    if error.__cause__ is not None:
        logging.getLogger("provision").debug("%s (caused by %s)", error, " <- ".join(causes(error)))


def setup_logging(verbose: bool) -> None:
    logger = logging.getLogger("provision")
    logger.setLevel(logging.DEBUG)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.DEBUG if verbose else logging.WARNING)
    handlers: list[logging.Handler] = [console]
    path = config.log_file()
    if path:
        handlers.append(logging.FileHandler(path))
    from provision import secrets

    for handler in handlers:
        handler.addFilter(secrets.MaskingFilter())
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)


def missing_inventory(path: str | None, local_alone: bool = False) -> InventoryError:
    """No inventory where one was asked for, or anywhere the default is looked for: say where it looked,
    the ways to give one, and how to write one; `local_alone`: the task serves `--host local` without
    one (the host tasks; not bench, logs, ask or recipe.*, which read their host's settings from one).
    Where the first place named one that is not there, that is the headline: nothing after it was read,
    found or not."""
    from provision import hints

    write = (f"`{hints.command('init --host local')}` writes a starter one for this machine (`--host USER@ADDRESS` for SSH "
             "hosts, `--output FILE` elsewhere than ./inventory/hosts.yaml)")
    if path is not None:
        return InventoryError(f"no such file or directory; {write}", file=path)
    looked = []
    places = config.inventory_lookup()
    chosen = config.default_inventory()
    for number, place in enumerate(places, 1):
        where = place.path
        state = "not set" if where is None else f"{where}: {'absent' if not where.exists() else 'found'}"
        if place.passed_over:
            state += f", {place.passed_over}"
        elif where is not None and where.exists() and where != chosen:
            state += f", not read: {chosen} comes first"
        looked.append(f"  {number}. {place.what}: {state}")
    headline = "none found"
    if chosen in {place.path for place in places[:-1]}:
        named = next(place for place in places if place.path == chosen)
        headline = (f"{named.what} names {chosen}, which is not there (while it is named, the places after it "
                    "are not read)")
    return InventoryError(
        f"{headline}. Looked, in this order:\n" + "\n".join(looked) + "\n"
        "Give one with --inventory FILE, or $PROVISION_INVENTORY=FILE, or put it in ./inventory/ in the current "
        f"directory; {write}." + (" `--host local` alone needs no inventory." if local_alone else ""),
        file="inventory")


def load_inventory(path: str | None, local_only: bool = False, local_alone: bool = False) -> Inventory:
    """The inventory named, else the default one. With `local_only` (the task names `--host local` and
    nothing else), none named (--inventory, $PROVISION_INVENTORY) and none found: an empty one, since
    this machine needs none; `local_alone`: the task would (missing_inventory says so)."""
    from provision import inventory

    chosen = Path(path) if path else config.default_inventory()
    if not chosen.exists():
        # --inventory, $PROVISION_INVENTORY or $PROVISION_LAB=1: one was asked for, and it is not there
        named = path is not None or config.inventory_lookup()[0].path is not None or config.lab_asked()
        if local_only and not named:
            return inventory.Inventory(hosts={}, groups={}, clusters={}, ssh=inventory.SshSettings())
        raise missing_inventory(path, local_alone)
    return inventory.load(chosen, allow_empty=local_only)


def profile_named(name: str | None) -> Profile | None:
    if name is None:
        return None
    from provision.profiles import load_profiles

    profiles = load_profiles()
    if name not in profiles:
        raise InventoryError(f"unknown profile '{name}' (known: {', '.join(sorted(profiles))})",
                             file="command line", key="--profile")
    return profiles[name]


HOST_TASK_HELP = help_for("inventory", "host", "cluster", "all", "json", "accept-new-host-keys", "profile",
                       "set", "verbose", force="override a blocker by its check id (repeatable)")



@dataclass(frozen=True)
class Selection:
    """The inventory a task was pointed at, the hosts it names, and the command line's overrides."""

    inventory: Inventory
    targets: list[Host]
    overrides: dict[str, Any]

    @property
    def order(self) -> list[str]:
        return [target.name for target in self.targets]


def select(inventory_: str | None, host: Sequence[str] | None = None, cluster: Sequence[str] | None = None,
           all_: bool = False, set_: Sequence[str] | None = None, default_all: bool = False,
           targets: bool = True) -> Selection:
    """--inventory, --host/--cluster/--all and --set, as every host task reads them (InventoryError: exit 2).
    With default_all, naming no host means all of them (status, deploy); without targets (inventory,
    bench, logs: they name their host otherwise) none are chosen."""
    from provision import inventory

    local_only = targets and not (cluster or all_) and bool(host) \
        and set(host or ()) == {inventory.LOCAL_HOST}
    inv = load_inventory(inventory_, local_only=local_only, local_alone=targets)
    overrides = inventory.parse_overrides(list(set_ or []))
    if not targets:
        return Selection(inv, [], overrides)
    everything = all_ or (default_all and not (host or cluster))
    return Selection(inv, inv.select(hosts=list(host or []), clusters=list(cluster or []), everything=everything),
                     overrides)


@dataclass(frozen=True)
class HostFlags:
    """The flags the host tasks share, parsed once; a task that has no such flag gets the default."""

    inventory: str | None = None
    host: tuple[str, ...] = ()
    cluster: tuple[str, ...] = ()
    all: bool = False
    json: bool = False
    accept_new_host_keys: bool = False
    profile: str | None = None
    set: tuple[str, ...] = ()
    force: tuple[str, ...] = ()
    wait: float = 0
    verbose: bool = False

    def select(self, *, default_all: bool = False, targets: bool = True) -> Selection:
        return select(self.inventory, self.host, self.cluster, self.all, self.set, default_all, targets)

    def one_cluster(self, task: str) -> str | None:
        """The one cluster a task that takes one was given (None: none); a usage error (exit 2) for more."""
        if len(self.cluster) > 1:
            raise Exit(f"error: {task} takes one cluster; --cluster was given {len(self.cluster)} times "
                       f"({', '.join(self.cluster)})", code=2)
        return self.cluster[0] if self.cluster else None

    def options(self, selection: Selection, *, only: str | None = None, verify: bool = False,
                may_build: bool = False) -> Options:
        """The run's Options from these flags and what the task adds."""
        from provision.run import Options

        return Options(overrides=selection.overrides, profile=profile_named(self.profile),
                       accept_new_host_keys=self.accept_new_host_keys, force=self.force, wait=self.wait,
                       quiet=self.json, only=only, verify=verify, may_build=may_build)


# The own flags of the tasks that have many, parsed (host_task's `asked`); the libraries read them.


@dataclass(frozen=True)
class PrepareFlags:
    """What the prepare task was asked on its command line."""

    reboot: bool = False
    dry_run: bool = False
    batch: int = 1
    timeout: float = 600  # seconds a rebooting host has to come back
    lock_wait: float = 120  # seconds apt waits for dpkg's lock


@dataclass(frozen=True)
class NcclFlags:
    """What verify.nccl was asked: message sizes (text: 1M, 1G), all-reduces per size, GPUs per host,
    the rendezvous port, seconds the test may take, where to keep each node's answer."""

    min_bytes: str = "1M"
    max_bytes: str = "1G"
    iters: int = 20
    warmup: int = 5
    gpus: int = 0
    port: int = config.NCCL_PORT
    timeout: int = 600
    log_dir: str | None = None


@dataclass(frozen=True)
class TuneFlags:
    """What tune was asked: the space and workload files, the latency bounds and the budget (text, read
    by the task), seconds each trial's server has to become ready, whether to draw the trials, and the
    endpoint (and its model) to tune through instead of hosts."""

    space: str | None = None
    workload: str | None = None
    slo_ttft_ms: str | None = None
    slo_itl_ms: str | None = None
    budget: str | None = None
    timeout: float = 600
    no_plot: bool = False
    endpoint: str | None = None
    model: str | None = None


@dataclass(frozen=True)
class Flag:
    """A shared flag as Invoke reads it off a signature: the parameter's name (a trailing _ where the
    name is Python's: --all, --json), its default, and whether it repeats."""

    parameter: str
    default: Any = None
    annotation: str = "str | None"
    repeats: bool = False

    @property
    def field(self) -> str:
        return self.parameter.rstrip("_")


SHARED_FLAGS = {
    "host": Flag("host", annotation="list[str] | None", repeats=True),
    "cluster": Flag("cluster", annotation="list[str] | None", repeats=True),
    "all": Flag("all_", False, "bool"),
    "inventory": Flag("inventory_"),
    "json": Flag("json_", False, "bool"),
    "accept-new-host-keys": Flag("accept_new_host_keys", False, "bool"),
    "profile": Flag("profile"),
    "set": Flag("set_", annotation="list[str] | None", repeats=True),
    "force": Flag("force", annotation="list[str] | None", repeats=True),
    "wait": Flag("wait", 0, "float"),
    "verbose": Flag("verbose", False, "bool"),
}
TARGETS = ("inventory", "host", "cluster", "all", "json", "accept-new-host-keys", "profile", "set", "verbose")
HOST_TASK_FLAGS = (*TARGETS, "force")  # check, plan, tune, prepare: the run's gate


def host_task(name: str, *shared: str, help: Mapping[str, str] | None = None, asked: type | None = None,
              iterable: Sequence[str] = ()) -> Callable[[Callable[..., None]], Task[Any]]:
    """An Invoke task (errors mapped by `guarded`) whose body is `body(c, flags: HostFlags, **own)`: the
    `shared` flags (SHARED_FLAGS' names) are declared for it, each with COMMON_HELP's help unless
    `help` gives its own, beside the body's own parameters and their `help`. With `asked` (a dataclass
    whose every field has a default), its fields are the task's own flags instead, and the body is
    `body(c, flags, asked_instance)`. A task with `verbose` among `shared` has its logging set up (see
    setup_logging) before the body runs."""
    unknown = set(shared) - set(SHARED_FLAGS)
    if unknown:
        raise ValueError(f"not a shared flag: {', '.join(sorted(unknown))}")
    flags = [SHARED_FLAGS[flag] for flag in shared]
    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD

    def decorate(body: Callable[..., None]) -> Task[Any]:
        context, _, *own = inspect.signature(body).parameters.values()
        if asked is not None:
            own = [inspect.Parameter(item.name, keyword, default=item.default, annotation=item.type)
                   for item in dataclasses.fields(asked)]
        declared = [inspect.Parameter(flag.parameter, keyword, default=flag.default, annotation=flag.annotation)
                    for flag in flags]
        last = [parameter for parameter in declared if parameter.name == "verbose"]  # after the task's own
        # The body's own parameters without a default come first: Invoke takes them as positional.
        required = [parameter for parameter in own if parameter.default is inspect.Parameter.empty]
        optional = [parameter for parameter in own if parameter not in required]
        signature = inspect.Signature([context, *required, *[p for p in declared if p not in last], *optional, *last],
                                      return_annotation=None)

        @functools.wraps(body)
        def parsed(c: Any, **given: Any) -> None:
            values = {flag.field: given.pop(flag.parameter) for flag in flags}
            for flag in flags:
                if flag.repeats:
                    values[flag.field] = tuple(values[flag.field] or ())
            parsed_flags = HostFlags(**values)
            if "verbose" in shared:  # a task with --verbose logs as it asks, before its body runs
                setup_logging(parsed_flags.verbose)
            if asked is not None:
                return body(c, parsed_flags, asked(**given))
            return body(c, parsed_flags, **given)

        parsed.__signature__ = signature  # type: ignore[attr-defined]  # what Invoke reads the flags off
        helps = {**{name: COMMON_HELP[name] for name in shared}, **(help or {})}
        repeated = [flag.parameter for flag in flags if flag.repeats]
        return task(auto_shortflags=False, name=name, help=helps,
                    iterable=[*repeated, *iterable])(guarded(parsed))

    return decorate


def exit_unless(ok: bool) -> None:
    """Exit code 1 when something on a host failed (the report is printed already)."""
    if not ok:
        raise Exit(code=1)
