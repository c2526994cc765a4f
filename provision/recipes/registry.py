"""Recipe registries: git repositories of recipes that a user keeps current, as sparkrun keeps them.

    invoke registry.add https://github.com/spark-arena/recipe-registry --name spark-arena
    invoke registry.update   # each registry fetched again, its recipes read at the new commit
    invoke recipe.list       # the shipped recipes and every registry's, side by side

Each registry is a clone made with the user's own git (their credentials, proxy and git config) under the
user's data directory (config.data_dir()/registries/NAME), and one entry of registries.yaml beside the
clones: its URL, the commit checked out and when. Its recipes are read from that checkout each time they
are listed: Spark Arena v2 files (sparkrun's format) by provision/recipes/sparkarena.py, the tool's own
format by provision/recipes. A registry's recipe is named REGISTRY/FILE-STEM (one under an experimental
folder, or of a stem two folders hold, by its path: REGISTRY/FOLDER/.../STEM) and says where it was read:
the registry, its URL, the commit and the file. Files that are no recipe (a registry's own index, a
benchmark profile) are counted apart from recipes that were refused, each with why.

Git runs on this machine only, never on a host: add clones, update fetches and checks out what the remote's
default branch holds now, remove deletes the clone.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from provision import config, datafiles
from provision.errors import RecipeError, clip
from provision.recipes import MAX_RECIPE_BYTES, Recipe, from_mapping, read_yaml

NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
MAX_FILES = 2000  # a registry holds a few hundred files; a bigger tree is not one
GIT_TIMEOUT = 600  # seconds: a clone of a large registry over a slow link
INDEX = "registries.yaml"
_ENTRY_KEYS = {"name", "url", "commit", "updated"}


@dataclass(frozen=True)
class Registry:
    """One registry the user added: Registry('spark-arena', 'https://github.com/...', '3075780...', '2026-12-04')."""

    name: str
    url: str
    commit: str  # the commit its clone holds: every recipe listed from it was read at this commit
    updated: str  # when it was cloned or last updated (UTC, ISO 8601)

    @property
    def clone(self) -> Path:
        return clones_dir() / self.name


@dataclass(frozen=True)
class Listed:
    """A registry's recipe and where it was read: the registry, the file (relative to the checkout)."""

    recipe: Recipe
    registry: Registry
    path: str


@dataclass(frozen=True)
class Contents:
    """What a registry's checkout holds: its recipes, the recipe files refused (path, why) and the YAML
    files that are no recipe (path, why)."""

    registry: Registry
    recipes: tuple[Listed, ...]
    refused: tuple[tuple[str, str], ...]
    not_recipes: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Updated:
    """One registry's update: the commit before and after, and the recipe files that changed
    (git's status letter A/M/D/R and the path)."""

    registry: Registry
    before: str
    changed: tuple[tuple[str, str], ...]

    @property
    def unchanged(self) -> bool:
        return self.before == self.registry.commit


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One change of the registries at a time (add, update, remove read the index, work, and write it
    back: two at once would lose one's entry). Another run holding it is waited for, and said."""
    import fcntl
    import sys

    config.data_dir().mkdir(parents=True, exist_ok=True)
    with open(config.data_dir() / "registries.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("waiting for another run's change of the registries ...", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def index_file() -> Path:
    return config.data_dir() / INDEX


def clones_dir() -> Path:
    return config.data_dir() / "registries"


def load() -> list[Registry]:
    """The registries added, in the order they were added (none: an empty list)."""
    path = index_file()
    if not path.exists():
        return []
    data = read_yaml(datafiles.read_bounded(path, 1024 * 1024, RecipeError, "a registry index"), str(path))
    entries = (data or {}).get("registries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise RecipeError("not a registry index (a mapping with a list 'registries')", file=str(path))
    found = []
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS or not all(isinstance(entry[key], str)
                                                                                for key in _ENTRY_KEYS):
            raise RecipeError(f"a registry entry is {', '.join(sorted(_ENTRY_KEYS))}, all text: got "
                              f"{clip(repr(entry))}", file=str(path))
        found.append(Registry(**entry))
    return found


def _save(registries: Sequence[Registry]) -> None:
    text = ("# The recipe registries added with `registry.add`; their clones are in registries/.\n" +
            yaml.safe_dump({"registries": [dataclasses.asdict(item) for item in registries]}, sort_keys=False))
    datafiles.write_whole(index_file(), text)


def named(name: str, registries: Sequence[Registry] | None = None) -> Registry:
    known = load() if registries is None else registries
    for registry in known:
        if registry.name == name:
            return registry
    listed = ", ".join(item.name for item in known) or "none added"
    raise RecipeError(f"no registry '{clip(name)}' (registries: {listed}; add one with "
                      "`registry.add URL --name NAME`)", file="command line")


def name_of(url: str) -> str:
    """A registry's default name: its URL's last part, lowercased, without .git
    (https://github.com/spark-arena/recipe-registry.git -> recipe-registry)."""
    last = re.split(r"[/:]", url.rstrip("/"))[-1].lower()
    return last.removesuffix(".git")


def _holds_credentials(url: str) -> bool:
    """A URL that carries a secret: a password anywhere (https://user:secret@, ssh://git:secret@), or any
    user at all over http(s), where it is a token (https://ghp_...@github.com/...). ssh's git@ is a login
    name, no secret."""
    from urllib.parse import urlsplit

    if "://" not in url:
        return False  # git@host:org/repo.git or a path
    parts = urlsplit(url)
    return parts.password is not None or (parts.scheme.lower() in ("http", "https") and parts.username is not None)


def add(name: str, url: str) -> Registry:
    """Clone `url` as registry `name` and read it once: a clone with no recipe in it is not added."""
    with _locked():
        return _add(name, url)


def _add(name: str, url: str) -> Registry:
    if not NAME.match(name):
        raise RecipeError(f"a registry's name is lowercase letters, digits, '.', '_' and '-' (at most 63), "
                          f"starting with a letter or digit: not {clip(repr(name))}", file="command line")
    known = load()
    if any(item.name == name for item in known):
        raise RecipeError(f"registry '{name}' exists already (`registry.update --name {name}` fetches "
                          "it again; `registry.remove " + name + "` first to point it elsewhere)",
                          file="command line")
    if _holds_credentials(url):
        raise RecipeError("the URL holds a password or token, which would be kept in registries.yaml and shown "
                          "in every listing: give git its credentials (a credential helper, an SSH key) and "
                          "the URL without them", file="command line")
    target = clones_dir() / name
    partial = target.with_name(f".{name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    if target.exists():
        raise RecipeError(f"{target} exists but is no registry of {index_file()}: remove it or choose another "
                          "name", file="command line")
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        git("clone", "--quiet", "--depth", "1", "--", url, str(partial))
        registry = Registry(name, url, git("-C", str(partial), "rev-parse", "HEAD"), _now())
        contents = read(registry, root=partial)
        if not contents.recipes and not contents.refused:
            raise RecipeError(f"{url} holds no recipe (Spark Arena v2 or this tool's format) in "
                              f"{len(contents.not_recipes)} YAML file(s): not added", file="command line")
        if not contents.recipes:  # every recipe refused: a registry listed with none would say nothing
            raise RecipeError(f"{url}: none of its {len(contents.refused)} recipe(s) can be read here, so it is "
                              f"not added; {_reasons(contents.refused)}", file="command line")
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    _save([*known, registry])
    return registry


def _reasons(refused: Sequence[tuple[str, str]], shown: int = 3) -> str:
    """Why files were refused, each reason once with how many files it refused and the first of them."""
    by_reason: dict[str, list[str]] = {}
    for path, why in refused:
        by_reason.setdefault(why, []).append(path)
    parts = [f"{len(paths)} refused: {clip(why, 300)} (e.g. {paths[0]})" for why, paths in
             sorted(by_reason.items(), key=lambda item: -len(item[1]))[:shown]]
    more = f"; and {len(by_reason) - shown} other reason(s)" if len(by_reason) > shown else ""
    return "; ".join(parts) + more


def update(names: Iterable[str] = ()) -> list[Updated | RecipeError]:
    """Each registry named (all where none is) fetched and checked out at what its remote's default
    branch holds now. One that fails is its RecipeError in the list; the others are still updated."""
    with _locked():
        return _update(names)


def _update(names: Iterable[str]) -> list[Updated | RecipeError]:
    known = load()
    chosen = [named(name, known) for name in names] if names else list(known)
    results: list[Updated | RecipeError] = []
    for registry in chosen:
        try:
            done = _update_one(registry)
        except RecipeError as exc:
            results.append(exc)
            continue
        results.append(done)
        known = [done.registry if item.name == registry.name else item for item in known]
        _save(known)  # after each: a later failure keeps the commits already checked out
    return results


def _update_one(registry: Registry) -> Updated:
    clone = str(registry.clone)
    if not registry.clone.is_dir():
        raise RecipeError(f"registry '{registry.name}': its clone {clone} is gone (`registry.remove "
                          f"{registry.name}` then add it again)", file="command line")
    git("-C", clone, "fetch", "--quiet", "--depth", "1", "origin", "HEAD")
    fetched = git("-C", clone, "rev-parse", "FETCH_HEAD")
    changed: tuple[tuple[str, str], ...] = ()
    if fetched != registry.commit:
        status = git("-C", clone, "diff", "--name-status", "--no-renames", registry.commit, fetched)
        changed = tuple((line[0], line[1:].strip()) for line in status.splitlines()
                        if line[:1] and line.rstrip().endswith((".yaml", ".yml")))
        git("-C", clone, "checkout", "--quiet", "--detach", fetched)
    return Updated(dataclasses.replace(registry, commit=fetched, updated=_now()), registry.commit, changed)


def remove(name: str) -> Registry:
    with _locked():
        known = load()
        registry = named(name, known)
        shutil.rmtree(registry.clone, ignore_errors=True)
        _save([item for item in known if item.name != name])
    return registry


def read(registry: Registry, root: Path | None = None, overrides: Mapping[str, Any] | None = None) -> Contents:
    """The recipes of a registry's checkout (`root`: its clone), each named REGISTRY/STEM, each file
    judged alone: one that cannot be read is refused, the rest still listed."""
    from provision.recipes import sparkarena

    base = root or registry.clone
    if not base.is_dir():
        raise RecipeError(f"registry '{registry.name}': its clone {base} is gone (`registry.remove "
                          f"{registry.name}` then add it again)", file="command line")
    if root is None:
        # What the clone holds is what its recipes are read at (an update cut short between its checkout
        # and the index's write leaves the index one commit behind).
        registry = dataclasses.replace(registry, commit=git("-C", str(base), "rev-parse", "HEAD"))
    files = yaml_files(base)
    listed: list[Listed] = []
    refused: list[tuple[str, str]] = []
    not_recipes: list[tuple[str, str]] = []
    short = _short_names(base, files)
    for path in files:
        relative = str(path.relative_to(base))
        name = f"{registry.name}/{relative.rsplit('.', 1)[0] if path not in short else path.stem}"
        where = f"{registry.url} at {registry.commit}: {relative}"
        try:
            data = datafiles.read_bounded(path, MAX_RECIPE_BYTES, RecipeError, "a recipe")
            parsed = read_yaml(data, relative)
            if not isinstance(parsed, dict) or "model" not in parsed:
                # Both formats name a model: a registry's index, a benchmark profile, a mod's config.
                not_recipes.append((relative, "names no model: not a recipe"))
                continue
            if _is_ours(parsed):
                recipe = from_mapping(parsed, relative)
                _refuse_local_files(recipe, relative)
                note = f"read from registry {registry.name}: {where}"
                recipe = dataclasses.replace(recipe, name=name, notes=(*recipe.notes, note))
            else:
                imported = sparkarena.read(data, where, name, overrides or {})
                if imported.recipe is None:
                    refused.append((relative, imported.refused))
                    continue
                recipe = imported.recipe
        except RecipeError as exc:
            refused.append((relative, exc.message + (f" (line {exc.line})" if exc.line else "")))
            continue
        listed.append(Listed(dataclasses.replace(recipe, file=str(path)), registry, relative))
    return Contents(registry, tuple(listed), tuple(refused), tuple(not_recipes))


def is_experimental(relative: str) -> bool:
    """A file of a registry's experimental part: its first folder is experimental-recipes (Spark Arena's
    layout, which sparkrun reads as a registry of its own, `experimental`, hidden from its listings), or
    any first folder whose name starts with `experimental`."""
    parts = Path(relative).parts
    return len(parts) > 1 and parts[0].startswith("experimental")


def _short_names(base: Path, files: Sequence[Path]) -> set[Path]:
    """The files named REGISTRY/FILE-STEM; every other file is named by its path (REGISTRY/FOLDER/.../STEM).

    A stem goes to the file of it outside the experimental folders, the one least deep where there are
    several (sparkrun's own rule within a registry: eugr's recipes/NAME.yaml over its
    recipes/3x-spark-cluster/NAME.yaml, as eugr-recipes' recipes/README.md says); an experimental file is
    named by its path only (asked for by that), so a registry's update that adds an experimental file of
    the same stem never repoints a name. Two files of one stem equally deep outside them: neither has the
    short name, and asking for it is refused with every file of it (`find`)."""
    by_stem: dict[str, list[Path]] = {}
    for path in files:
        if not is_experimental(str(path.relative_to(base))):
            by_stem.setdefault(path.stem, []).append(path)
    short = set()
    for paths in by_stem.values():
        depth = min(len(path.parts) for path in paths)
        least = [path for path in paths if len(path.parts) == depth]
        if len(least) == 1:
            short.add(least[0])
    return short


def yaml_files(root: Path) -> list[Path]:
    """The YAML files of a checkout (sorted; git's own folder left out), or RecipeError where there are
    more than a registry ever holds. Also what `recipe.import DIR` reads."""
    files = sorted(path for path in root.rglob("*") if path.suffix in (".yaml", ".yml") and path.is_file()
                   and ".git" not in path.relative_to(root).parts)
    if len(files) > MAX_FILES:
        raise RecipeError(f"more than {MAX_FILES} YAML files: not a recipe registry", file=str(root))
    return files


def _refuse_local_files(recipe: Recipe, source: str) -> None:
    """A registry's recipe names no file of this machine: its server_files may only say which files it
    needs (image:PATH), for the user to give. Else a recipe someone else wrote would copy whatever file
    it names here (~/.ssh/..., /etc/...) to every host it is applied to."""
    from provision import serverfiles

    local = sorted(flag for flag, value in dict(recipe.settings.get("server_files") or {}).items()
                   if not serverfiles.is_image(str(value)))
    if local:
        raise RecipeError(f"server_files {', '.join(local)} name files of this machine: a registry's recipe may "
                          f"only name the files it needs ({serverfiles.IMAGE}PATH), which you give", file=source,
                          key="server_files")


def _is_ours(data: Any) -> bool:
    """The tool's own recipe format: a mapping with its hardware and engine fields."""
    return isinstance(data, dict) and isinstance(data.get("hardware"), dict) and isinstance(data.get("engine"), dict)


def everything(overrides: Mapping[str, Any] | None = None) -> tuple[list[Contents], list[RecipeError]]:
    """Every registry's contents, in the order they were added, and the errors of those that cannot be
    read (a clone removed by hand): one broken registry never hides the others or the shipped recipes."""
    found: list[Contents] = []
    errors: list[RecipeError] = []
    for registry in load():
        try:
            found.append(read(registry, overrides=overrides))
        except RecipeError as exc:
            errors.append(exc)
    return found, errors


def find(name: str) -> Recipe:
    """A shipped recipe, a recipe file, or a registry's recipe by REGISTRY/NAME (read at its clone's commit)."""
    from provision import recipes

    head, _, rest = name.partition("/")
    if not rest or Path(name).suffix in (".yaml", ".yml") or not NAME.match(head):
        return recipes.find(name)
    known = load()
    if not any(item.name == head for item in known):
        return recipes.find(name)
    contents = read(named(head, known))
    for item in contents.recipes:
        if item.recipe.name == name:
            return item.recipe
    candidates = [item for item in contents.recipes if "/" not in rest and Path(item.path).stem == rest]
    if candidates:
        _refuse_short_name(name, candidates)
    for path, why in contents.refused:
        if name in (f"{head}/{Path(path).stem}", f"{head}/{path.rsplit('.', 1)[0]}"):
            raise RecipeError(f"registry {head}'s {path} is not imported: {why}", file="command line")
    shown = ", ".join(item.recipe.name for item in contents.recipes[:8]) or "none"
    raise RecipeError(f"no recipe '{clip(name)}' in registry {head} at {contents.registry.commit[:12]} "
                      f"(its recipes: {shown}{', ...' if len(contents.recipes) > 8 else ''}; all: "
                      "`recipe.list`)", file="command line")


def _refuse_short_name(name: str, candidates: Sequence[Listed]) -> None:
    """A short name no file holds alone: the files of its stem, each by the name that asks for it."""
    shown = "; ".join(f"{item.recipe.name}{' (experimental)' if is_experimental(item.path) else ''}"
                      for item in candidates)
    if all(is_experimental(item.path) for item in candidates):
        raise RecipeError(f"'{clip(name)}' is only an experimental recipe, which is taken only when asked for by "
                          f"its path: {shown}", file="command line")
    raise RecipeError(f"'{clip(name)}' is ambiguous: folders equally deep outside the experimental ones hold a "
                      f"file of that name; name one: {shown}", file="command line")


def git(*args: str) -> str:
    """This machine's git (its credentials, proxy and config), its output stripped; RecipeError with git's
    whole message where it fails."""
    program = shutil.which("git")
    if program is None:
        raise RecipeError("git is not installed here: registries are git repositories (install git)",
                          file="command line")
    try:
        done = subprocess.run([program, *args], capture_output=True, text=True, timeout=GIT_TIMEOUT, check=False,
                              stdin=subprocess.DEVNULL, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    except subprocess.TimeoutExpired as exc:
        raise RecipeError(f"git {args[0] if args[0] != '-C' else args[2]} ran past {GIT_TIMEOUT} s",
                          file="command line") from exc
    if done.returncode != 0:
        said = " ".join(line.strip() for line in done.stderr.strip().splitlines() if line.strip()) or "no output"
        # The subcommand and what it was given (a URL, a commit), not its options or this machine's paths.
        words = args[2:] if args[0] == "-C" else args
        shown = " ".join(word for word in words if not word.startswith(("-", "/")) and not word.isdigit())
        raise RecipeError(f"git {shown} failed (exit {done.returncode}): {said}", file="command line")
    return done.stdout.strip()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
