"""`provision init`: a starter inventory from what the hosts are. Pure: facts in, text out.

For each host gathered (the one-round-trip probe): the profile whose GPU it has (every GPU's compute
capability and name as the profile expects, on the profile's CPU architecture), or why none fits;
tensor parallel = its GPU count; and the first model of starter_models.yaml that the gate's own
memory.fits rule passes at that tensor parallel size. The text it renders has a comment on every
line and must load with the inventory loader (the task loads it before it puts it in place).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision import checks, hints, inventory, kvcache
from provision.context import Context
from provision.errors import InventoryError, OutputExists
from provision.facts import HostFacts
from provision.kvcache import KnownModel, known_models
from provision.profiles import Profile


@dataclass(frozen=True)
class ProfileChoice:
    profile: Profile | None  # None: unsupported
    reason: str  # why this profile, or why none


def _unique(profiles: Mapping[str, Profile]) -> list[Profile]:
    """One entry per profile (the mapping holds aliases too), in name order."""
    return sorted({profile.name: profile for profile in profiles.values()}.values(), key=lambda p: p.name)


def choose_profile(facts: HostFacts, profiles: Mapping[str, Profile]) -> ProfileChoice:
    """The profile whose GPU this host has. No GPU at all: the CPU profile (vLLM's CPU build)."""
    gpus = facts.gpus
    if gpus is None:
        return ProfileChoice(None, "unsupported: nvidia-smi answered but its output could not be read "
                                   f"({facts.notes.get('gpus', 'no note')})")
    if not gpus:
        cpu = [p for p in _unique(profiles) if p.gpu is None and p.arch in ("any", facts.arch)]
        why = facts.notes.get("gpus", "nvidia-smi lists none")
        if cpu:
            return ProfileChoice(cpu[0], f"no GPU ({why}): {cpu[0].name}, {cpu[0].description}")
        return ProfileChoice(None, f"unsupported: no GPU ({why}) and no CPU profile for {facts.arch}")
    kinds = sorted({f"{gpu.name} (compute capability {gpu.compute_cap or 'unknown'})" for gpu in gpus})
    if len(kinds) > 1:
        return ProfileChoice(None, f"unsupported: mixed GPUs ({'; '.join(kinds)}); a profile is for one kind")
    gpu = gpus[0]
    # By compute capability, as the gate's gpu.compute_capability rule judges; the name only breaks a tie
    # (a name like "NVIDIA H200" only orders profiles of one capability; no rule reads it).
    same = [p for p in _unique(profiles) if p.gpu is not None and p.gpu.compute_capability == gpu.compute_cap]
    same.sort(key=lambda p: p.gpu is None or p.gpu.name_contains not in gpu.name)
    for profile in same:
        if profile.arch in ("any", facts.arch):
            return ProfileChoice(profile, f"{len(gpus)} x {kinds[0]}: {profile.name}, {profile.description}")
    if same:
        return ProfileChoice(None, f"unsupported: {kinds[0]} matches profile {same[0].name}, which is for "
                                   f"{same[0].arch} hosts, not {facts.arch}")
    known = ", ".join(f"{p.name} (compute capability {p.gpu.compute_capability})"
                      for p in _unique(profiles) if p.gpu is not None)
    return ProfileChoice(None, f"unsupported: {kinds[0]} matches no profile (known: {known})")


@dataclass(frozen=True)
class Suggestion:
    model: str | None
    max_model_len: int | None
    reason: str  # the rule's own words for the fit, or why nothing is suggested
    source: str | None = None


def _context(name: str, profile: Profile, facts: HostFacts, values: Mapping[str, Any],
             model_config: Mapping[str, Any]) -> Context:
    host = inventory.Host(name=name, address="localhost", port=22, user="root", profile=profile,
                          connection="local", key_file=None,
                          vars=inventory.validate_vars(dict(values), source="init", entity=name), source="init")
    inv = inventory.Inventory(hosts={name: host}, groups={}, clusters={}, ssh=inventory.SshSettings())
    return Context(host=name, profile=profile, settings=inv.settings(name), facts=facts, model_config=model_config)


def suggest_model(name: str, profile: Profile, facts: HostFacts, tensor_parallel: int,
                  models: Sequence[KnownModel] | None = None) -> Suggestion:
    """The first known model, at the first of its context lengths, that memory.fits passes."""
    if profile.gpu is None:
        return Suggestion(None, None, "no model suggested: the known models are for GPUs; on vLLM's CPU build "
                                      "name a small one as model")
    for known in known_models() if models is None else models:
        for length in known.contexts:
            values = {"model": known.model, "tensor_parallel_size": tensor_parallel, "max_model_len": length}
            found = checks.memory_fits(_context(name, profile, facts, values, known.config))
            if found.status == checks.PASS:
                return Suggestion(known.model, length, found.message, known.source)
    return Suggestion(None, None, "no model of the known list fits this host at tensor parallel "
                                  f"{tensor_parallel} (memory.fits); name one as model")


# ---------------------------------------------------------------------------------------------
# Targets named on the command line, and the starter file

LOCAL = inventory.LOCAL_HOST
_TARGET = re.compile(r"^(?:(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,62})=)?(?:(?P<user>[A-Za-z_][A-Za-z0-9_.-]*)@)?"
                     r"(?P<address>[^@=\s]+)$")


@dataclass(frozen=True)
class Target:
    name: str
    address: str | None  # None: this machine, no SSH
    user: str = "root"
    port: int = 22


def parse_target(text: str) -> Target:
    """`local`, or [NAME=][USER@]ADDRESS[:PORT] (an IPv6 address takes no port): InventoryError if not."""
    if text == LOCAL:
        return Target(LOCAL, None)
    match = _TARGET.match(text)
    if not match:
        raise InventoryError(f"expected 'local' or [NAME=][USER@]ADDRESS[:PORT], got {text!r}",
                             file="command line", key="--host")
    address, port = match["address"], 22
    if address.count(":") == 1:
        address, _, given = address.partition(":")
        if not given.isdigit() or not 1 <= int(given) <= 65535:
            raise InventoryError(f"port {given!r} is not a number from 1 to 65535", file="command line",
                                 key="--host")
        port = int(given)
    name = match["name"] or re.sub(r"[^A-Za-z0-9._-]", "-", address).strip("-._") or "host"
    return Target(name, address, match["user"] or "root", port)


def provisional_host(target: Target, profile: Profile) -> inventory.Host:
    """The host the probe is run on before its profile is known (the gather reads only paths)."""
    return inventory.Host(name=target.name, address=target.address or "localhost", port=target.port,
                          user=target.user, profile=profile,
                          connection="local" if target.address is None else "ssh", key_file=None, vars={},
                          source="command line")


@dataclass(frozen=True)
class Starter:
    """What init learned about one host."""

    target: Target
    choice: ProfileChoice
    gpus: int
    suggestion: Suggestion | None
    facts_summary: str

    @property
    def written(self) -> bool:
        return self.choice.profile is not None

    def as_json(self) -> dict[str, Any]:
        # This machine is reached with no SSH: no login and no port to report (the file has none either).
        reached: dict[str, Any] = {"connection": "local"} if self.target.address is None else {
            "connection": "ssh", "address": self.target.address, "user": self.target.user, "port": self.target.port}
        return {**reached,
                "profile": self.choice.profile.name if self.choice.profile else None,
                "profile_reason": self.choice.reason, "gpus": self.gpus, "written": self.written,
                "tensor_parallel_size": self.gpus if self.written and self.gpus else None,
                "model": self.suggestion.model if self.suggestion else None,
                "max_model_len": self.suggestion.max_model_len if self.suggestion else None,
                "model_reason": self.suggestion.reason if self.suggestion else None,
                "found": self.facts_summary}


def summary(facts: HostFacts) -> str:
    gpus = facts.gpus or ()
    memory = f"{facts.memory.total / 2**30:.0f} GiB RAM" if facts.memory else "RAM unknown"
    cpu = " + ".join(facts.cpu.model_names) if facts.cpu and facts.cpu.model_names else "CPU unknown"
    driver = f", driver {facts.driver.version} ({facts.driver.flavour})" if facts.driver else ""
    shown = ", ".join(sorted({gpu.name for gpu in gpus})) or "no GPU"
    count = f"{len(gpus)} GPU{'' if len(gpus) == 1 else 's'}"
    return f"{facts.arch or '?'}, kernel {facts.kernel or '?'}, {cpu}, {memory}, {count} ({shown}){driver}"


def starter(target: Target, facts: HostFacts, profiles: Mapping[str, Profile],
            models: Sequence[KnownModel] | None = None) -> Starter:
    choice = choose_profile(facts, profiles)
    count = len(facts.gpus or ())
    suggestion = None
    if choice.profile is not None:
        suggestion = suggest_model(target.name, choice.profile, facts, max(1, count), models)
    return Starter(target, choice, count, suggestion, summary(facts))


def _yaml(value: Any) -> str:
    """One scalar as YAML (JSON's forms are YAML's): strings always quoted."""
    return json.dumps(value)


@dataclass(frozen=True)
class SshChoice:
    known_hosts: str | None = None
    key_file: str | None = None
    notes: tuple[str, ...] = field(default=())


def render(starters: Sequence[Starter], ssh: SshChoice, command: str) -> str:
    """The starter inventory: every line a comment or a value with its comment."""
    tool = command.split()[0]
    lines = [f"# A starter inventory written by `{command}`: check each value, then",
             f"# `{tool} inventory --inventory THIS_FILE` validates it and shows each host's settings",
             "# (`--json`: every setting and where it came from). Schema (the documentation came with the tool):",
             f"#   {hints.docs_page('inventory.md')}",
             "# every setting with its type and default:",
             f"#   {hints.docs_page('reference/settings.md')}"]
    remote = [s for s in starters if s.target.address is not None and s.written]
    if remote and (ssh.known_hosts or ssh.key_file):
        lines.append("ssh:  # how every SSH host below is reached")
        if ssh.known_hosts:
            lines.append(f"  known_hosts: {_yaml(ssh.known_hosts)}  # host keys trusted (strict checking)")
        if ssh.key_file:
            lines.append(f"  key_file: {_yaml(ssh.key_file)}  # private key for the logins")
    lines.append("hosts:  # one entry per machine")
    for item in starters:
        lines.extend(_host_lines(item, tool))
    return "\n".join(lines) + "\n"


def _host_lines(item: Starter, tool: str) -> list[str]:
    target = item.target
    head = [f"  # {target.name}: {item.facts_summary}"]
    if item.choice.profile is None:
        return [*head, f"  # not written: {item.choice.reason}",
                f"  # {target.name}:  # add it with a profile once its hardware has one"]
    lines = [*head, f"  {target.name}:  # {item.choice.reason}"]
    if target.address is None:
        lines.append('    connection: "local"  # this machine itself, no SSH (`--host local`)')
    else:
        lines.append(f"    address: {_yaml(target.address)}  # where SSH reaches it")
        lines.append(f"    user: {_yaml(target.user)}  # the login (root, or a user with sudo)")
        if target.port != 22:
            lines.append(f"    port: {target.port}  # sshd's port")
    lines.append(f"    profile: {_yaml(item.choice.profile.name)}  # chosen from the GPUs the probe saw")
    suggestion = item.suggestion
    if item.gpus == 0 and (suggestion is None or suggestion.model is None):
        lines.append(f"    # vars: {{model: ORG/NAME}}  # {suggestion.reason if suggestion else 'no model'}")
        return lines
    lines.append(f"    vars:  # service settings; `{tool} inventory --json` lists them all")
    lines.append(f"      tensor_parallel_size: {max(1, item.gpus)}  # one shard per GPU: {item.gpus} found")
    if suggestion is not None and suggestion.model is not None:
        lines.append(f"      model: {_yaml(suggestion.model)}  # fits (memory.fits): {suggestion.reason}")
        lines.append(f"      max_model_len: {suggestion.max_model_len}  # the longest context tried that "
                     f"leaves room for {kvcache.MIN_CONCURRENT_SEQUENCES} such sequences at once")
        lines.append(f"      # model source: {suggestion.source}")
    elif suggestion is not None:
        lines.append(f"      # model: ORG/NAME  # {suggestion.reason}")
    return lines


# ---------------------------------------------------------------------------------------------
# The run: gather, render, check with the loader, then place the file without overwriting


@dataclass(frozen=True)
class Initialized:
    order: tuple[str, ...]
    starters: Mapping[str, Starter]
    errors: Mapping[str, BaseException]  # hosts the probe did not reach: nothing is written then
    output: str
    text: str | None  # what was written; None: nothing
    why_not: str | None = None  # why nothing was written

    @property
    def ok(self) -> bool:
        return self.text is not None


def refuse_existing(output: Path) -> None:
    if output.exists() or output.is_symlink():
        raise OutputExists("exists; init never overwrites a file: nothing changed (move it away, or pass "
                           "--output ANOTHER_FILE)", file=str(output))


def initialize(targets: Sequence[Target], output: Path, ssh: SshChoice, *, accept_new_host_keys: bool,
               command: str) -> Initialized:
    """Gather every target (one round trip each), choose, render, load the text with the inventory
    loader, and link it into place only if nothing is there (a race loses with OutputExists)."""
    from provision import run
    from provision.profiles import load_profiles

    names = [target.name for target in targets]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise InventoryError(f"named twice: {', '.join(twice)} (give each NAME=ADDRESS a name of its own)",
                             file="command line", key="--host")
    refuse_existing(output)
    profiles = load_profiles()
    hosts = [provisional_host(target, profiles["cpu"]) for target in targets]
    inv = inventory.Inventory(hosts={host.name: host for host in hosts}, groups={}, clusters={},
                              ssh=inventory.SshSettings(known_hosts=ssh.known_hosts, key_file=ssh.key_file))
    gathered = run.gather(inv, hosts, run.Options(accept_new_host_keys=accept_new_host_keys, quiet=True))
    starters = {t.name: starter(t, gathered.values[t.name], profiles) for t in targets if t.name in gathered.values}
    return write(tuple(target.name for target in targets), starters, gathered.errors, output, ssh, command)


def write(order: tuple[str, ...], starters: Mapping[str, Starter], errors: Mapping[str, BaseException],
          output: Path, ssh: SshChoice, command: str) -> Initialized:
    """Render, load with the inventory loader, link into place; nothing where a host failed or none fits."""
    refuse_existing(output)
    if errors:
        return Initialized(order, starters, errors, str(output), None,
                           "a host could not be probed: nothing written")
    if not any(item.written for item in starters.values()):
        return Initialized(order, starters, {}, str(output), None,
                           "no host has hardware a profile is for: nothing written")
    text = render([starters[name] for name in order], ssh, command)
    output.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".yaml", dir=output.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, 0o644)  # an inventory holds no secret (those live in its secrets: file)
        inventory.load(temporary)  # the tool's own loader: what init writes, every task reads
        try:
            os.link(temporary, output)  # fails if anything appeared there meanwhile
        except FileExistsError:
            refuse_existing(output)
            raise
    finally:
        os.unlink(temporary)
    return Initialized(order, starters, {}, str(output), text)
