"""Applying a recipe to a cluster: the file it writes beside the inventory and what it changes.

`invoke recipe.apply NAME --cluster C` writes `applied/C.yaml` beside the inventory (inside an inventory
directory), which the inventory reads above the cluster's own vars and below its groups', its hosts',
tuned settings and the command line (inventory.Inventory.settings). A file of its own, like tune's
`tuned/HOST.yaml`: the user's inventory file is never rewritten (its comments and layout stay theirs),
and removing the file goes back to the cluster's own settings.

Pure: plan() reads the inventory already loaded and the recipe; the task gates the result on the
cluster's hosts and writes the file (provision/recipe_tasks.py).
"""
from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from provision import serverfiles
from provision.errors import RecipeError
from provision.inventory import MERGED, AppliedRecipe, Inventory, Settings, applied_dir_of
from provision.recipes import Recipe, contract_notes

# The recipe's own choice: another engine is another recipe (its flags and pin mean nothing to it).
NOT_SETTABLE = ("engine",)


@dataclass(frozen=True)
class SettingChange:
    """A setting a host resolves differently once the recipe is applied, and the layer it comes from."""

    key: str
    before: Any
    after: Any
    origin: str


@dataclass(frozen=True)
class Kept:
    """A setting of the recipe a higher layer keeps from the host (a group's, the host's, tuned)."""

    key: str
    recipe_value: Any
    value: Any
    origin: str


@dataclass(frozen=True)
class Application:
    """What applying `recipe` to `cluster` writes (`path`: `old_text` is None where there is no file
    yet) and does: the inventory with it applied (what the gate judges), per host each setting that
    changes and each the recipe sets that a higher layer keeps, and what a reader must know."""

    cluster: str
    recipe: Recipe
    path: Path
    old_text: str | None
    new_text: str
    applied: Inventory
    changes: Mapping[str, tuple[SettingChange, ...]]
    kept: Mapping[str, tuple[Kept, ...]]
    notes: tuple[str, ...]
    dropped: tuple[str, ...] = ()  # what the recipe's source relied on that the hosts go without

    @property
    def unchanged(self) -> bool:
        return self.old_text == self.new_text

    @property
    def diff(self) -> str:
        return "".join(difflib.unified_diff((self.old_text or "").splitlines(keepends=True),
                                            self.new_text.splitlines(keepends=True),
                                            fromfile=f"{self.path} (now)", tofile=f"{self.path} (applied)"))


def plan(inv: Inventory, cluster: str, recipe: Recipe, overrides: Mapping[str, Any]) -> Application:
    """The file and the changes of applying `recipe` to `cluster`, `overrides` (validated `--set` values)
    in place of the recipe's own. RecipeError: what cannot be applied (exit 2)."""
    if inv.path is None:
        raise RecipeError("applying a recipe needs an inventory file or directory (--inventory)", file="command line")
    if cluster not in inv.clusters:
        raise RecipeError(f"no cluster {cluster!r} in the inventory (clusters: {', '.join(sorted(inv.clusters)) or 'none'})",
                          file="command line", key="--cluster")
    refused = [key for key in NOT_SETTABLE if key in overrides and overrides[key] != recipe.engine]
    if refused:
        raise RecipeError(f"--set {refused[0]}: the recipe's engine is {recipe.engine} (another engine is another "
                          "recipe)", file="command line")
    own = recipe.inventory_vars()
    values = {**own, **overrides}
    if "server_files" in overrides and "server_files" in own:  # a file given keeps the others the recipe needs
        values["server_files"] = {**own["server_files"], **overrides["server_files"]}
    changed = tuple(key for key in overrides if own.get(key) != overrides[key])
    if "model" in changed and "model_revision" not in overrides:
        values.pop("model_revision", None)  # the recipe's revision is its own model's commit or branch
    path = applied_dir_of(Path(inv.path)) / f"{cluster}.yaml"
    applied = dataclasses.replace(inv, applied={**inv.applied, cluster: AppliedRecipe(
        cluster=cluster, recipe=recipe.name, vars=values, file=str(path), changed=changed)})
    hosts = inv.clusters[cluster].hosts
    resolved = {host: applied.settings(host) for host in hosts}  # each host resolved once, with the recipe
    _refuse_image_files(recipe, cluster, resolved)
    changes = {host: _changes(inv.settings(host), resolved[host]) for host in hosts}
    kept = {host: _kept(resolved[host], values) for host in hosts}
    old_text = path.read_text(encoding="utf-8") if path.is_file() else None
    left_out = dropped(recipe, resolved)
    return Application(cluster=cluster, recipe=recipe, path=path, old_text=old_text,
                       new_text=applied_text(cluster, recipe, values, changed, left_out), applied=applied,
                       changes=changes, kept=kept,
                       notes=tuple(_notes(inv, cluster, recipe, values, changed, resolved)), dropped=left_out)


def dropped(recipe: Recipe, resolved: Mapping[str, Settings]) -> tuple[str, ...]:
    """What the recipe was run with at its source that the hosts will run without, said where the user
    decides (apply's output, its --json, the applied file's header): the mods an import did not carry
    (sparkrun's patches of the engine inside the container), and the engine's release where nothing
    pins it on a host (no engine_spec pin, venv_source or venv_wheels, all layers and --set resolved)."""
    from provision import catalog, venv

    found = []
    mods = recipe.upstream.get("mods") or []
    mods = [mods] if isinstance(mods, str) else list(mods)
    if mods:
        found.append(f"mods {', '.join(map(str, mods))}: the recipe's patches of {recipe.engine} inside its container "
                     "(sparkrun applies them before the launch), not applied here: see what each changes and "
                     "carry that into the venv or the host")
    entry = catalog.ENGINES.get(recipe.engine)
    if entry is not None and entry.version_source == "venv":
        unpinned = sorted(host for host, settings in resolved.items()
                          if not settings.venv_source and not settings.venv_wheels
                          and venv.pinned_version((settings.engine_spec or "").split(), recipe.engine) is None)
        if unpinned:
            found.append(f"engine pin: the recipe names no {entry.package} release and nothing pins one on "
                         f"{', '.join(unpinned)}, so the venv gets whatever release pip resolves: give the "
                         f"release it was run with, --set engine_spec={entry.package}==X.Y.Z")
    return tuple(found)


def _refuse_image_files(recipe: Recipe, cluster: str, resolved: Mapping[str, Settings]) -> None:
    """RecipeError where a host would run the recipe with a flag naming a file inside its container image
    (server_files image:PATH, Spark Arena's mods put them there): the server would not start. Each flag
    is named with that file and the setting that gives it (--set, or the inventory's vars)."""
    missing: dict[str, tuple[str, list[str]]] = {}
    for host, settings in resolved.items():
        for flag, path in serverfiles.needed(settings.server_files).items():
            missing.setdefault(flag, (path, []))[1].append(host)
    if not missing:
        return
    named = "; ".join(f"{flag} {path} (a file inside the recipe's container image; hosts {', '.join(hosts)})"
                      for flag, (path, hosts) in missing.items())
    lines = ", ".join(f"{flag}: LOCAL_FILE" for flag in missing)
    raise RecipeError(
        f"recipe {recipe.name} names a file no host has: {named}. Give each as a file on this machine, "
        f"copied to the hosts: {serverfiles.set_hint(missing)}, or in the vars of cluster {cluster}'s hosts "
        f"or groups (which the recipe does not override): `server_files: {{{lines}}}` (a path relative to the "
        "inventory file)",
        file="command line", key="server_files")


def applied_text(cluster: str, recipe: Recipe, values: Mapping[str, Any], changed: tuple[str, ...],
                 left_out: tuple[str, ...] = ()) -> str:
    """The file recipe.apply writes: the cluster, the recipe's name, what the hosts go without of it
    (`dropped`), what --set changed, the settings."""
    import textwrap

    body: dict[str, Any] = {"cluster": cluster, "recipe": recipe.name}
    if changed:
        body["changed"] = list(changed)
    body["vars"] = {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}
    header = (f"# Recipe {recipe.name} applied to cluster {cluster} by recipe.apply ({recipe.source}).\n"
              "# Read by the inventory above the cluster's own vars, below its groups', hosts' and tuned\n"
              "# settings; remove this file to go back to the cluster's own settings.\n")
    for what in left_out:
        header += "".join(f"# {line}\n" for line in textwrap.wrap(f"Not carried: {what}", 106,
                                                                   subsequent_indent="  ", break_long_words=False))
    return header + yaml.safe_dump(body, sort_keys=False, default_flow_style=False, allow_unicode=True)


def _changes(old: Settings, new: Settings) -> tuple[SettingChange, ...]:
    old_values, new_values = old.values, new.values
    return tuple(SettingChange(key, old_values[key], new_values[key], new.origin.get(key, "default"))
                 for key in new_values if old_values[key] != new_values[key])


def _kept(resolved: Settings, values: Mapping[str, Any]) -> tuple[Kept, ...]:
    """The recipe's settings that a layer above it decides on this host."""
    found = []
    for key, wanted in values.items():
        now = getattr(resolved, key)
        origin = resolved.origin.get(key, "default")
        if key in MERGED:  # merged across layers: each of its entries is its own setting
            for name, value in dict(wanted).items():
                if now.get(name) != value:
                    found.append(Kept(f"{key}.{name}", value, now.get(name), origin))
        elif not origin.startswith("recipe ") and now != (tuple(wanted) if isinstance(wanted, list) else wanted):
            found.append(Kept(key, wanted, now, origin))
    return tuple(found)


def _notes(inv: Inventory, cluster: str, recipe: Recipe, values: Mapping[str, Any],
           changed: tuple[str, ...], resolved: Mapping[str, Settings]) -> list[str]:
    notes = []
    hosts = inv.clusters[cluster].hosts
    other = sorted({inv.hosts[name].profile.name for name in hosts
                    if recipe.hardware.profile not in (inv.hosts[name].profile.name, *inv.hosts[name].profile.aliases)})
    if other:
        notes.append(f"measured on profile {recipe.hardware.profile}; cluster {cluster} runs {', '.join(other)}: "
                     "its figures say nothing of these hosts")
    if recipe.hardware.nodes != len(hosts):
        notes.append(f"measured on {recipe.hardware.nodes} node(s); cluster {cluster} has {len(hosts)}")
    if "model" in changed:
        notes.append(f"model {values['model']} in place of the recipe's {recipe.model} (--set): the recipe's "
                     "figures are not this model's")
    notes.extend(f"{key} {values[key]!r} in place of the recipe's (--set)" for key in changed if key != "model")
    for note in _judged(recipe, resolved):
        if note not in notes:
            notes.append(note)
    return notes


def _judged(recipe: Recipe, resolved: Mapping[str, Settings]) -> list[str]:
    """The contract table's word on what each host will run: its own engine_spec (a host's or group's
    pin sits above the recipe), flags and variables, all layers resolved. RecipeError names the host
    whose release lacks a flag."""
    notes: list[str] = []
    for host, settings in sorted(resolved.items()):
        running = {"engine_spec": settings.engine_spec, "server_flags": settings.server_flags,
                   "extra_args": settings.extra_args, "environment": settings.environment}
        engine = settings.engine or recipe.engine
        try:  # the recipe's release where nothing pins one (llama.cpp's: a build or a tag)
            notes.extend(note for note in contract_notes(engine, running,
                                                         recipe.engine_version if engine == recipe.engine else None)
                         if note not in notes)
        except RecipeError as exc:
            raise RecipeError(f"host {host}: {exc.message}", file=exc.file, line=exc.line, entity=exc.entity,
                              key=exc.key) from exc
    return notes
