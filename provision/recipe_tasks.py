"""`invoke recipe.*`: known-good settings per machine (provision/recipes), and Spark Arena's registry
read and written (provision/recipes/sparkarena.py). Parse the flags, call the library, print through
provision.report. Hosts are contacted only for the gate: recipe.apply's on the cluster it applies a recipe
to, `recipe.list --fits HOST` and `recipe.show --host HOST` on that host (nothing changes there).

Exit codes: 0 done; 1 the gate refused a host (nothing written); 2 bad usage, or a recipe that cannot be
read or used (one line on stderr).
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke.collection import Collection
from invoke.context import Context

from provision import hints
from provision.errors import RecipeError
from provision.taskargs import HostFlags, exit_unless, guarded, help_for, host_task, task

if TYPE_CHECKING:
    from provision.recipes.sparkarena import Imported

FORMATS = ("ours", "spark-arena")


FITS_HELP = ("a host of the inventory: the gate run on it with each recipe's settings (as --set gives them), "
             "its verdict and the memory fit shown; nothing changes on it")


@task(auto_shortflags=False, name="list",
      help=help_for("json", "inventory", profile="only the recipes measured on this hardware profile (or its alias)",
                    fits=FITS_HELP + " (with no --profile: the shipped recipes of its profile and every "
                                     "registry's; the venv's wheels are not resolved for a list: "
                                     "`recipe.show NAME --host HOST` resolves them)",
                    registry="only this registry's recipes (`shipped`: only the shipped ones)",
                    all="the registries' experimental recipes too (their experimental folders, which sparkrun "
                        "hides), each marked experimental; without it they are left out and counted below "
                        "the table (with --json: left out, and each entry says whether it is experimental)"))
@guarded
def list_(c: Context, profile: str | None = None, fits: str | None = None, inventory: str | None = None,
          registry: str | None = None, all_: bool = False, json_: bool = False) -> None:
    """List the recipes, shipped and from the registries.

    Model, engine, the hardware each was measured on, its figures and where it comes from (shipped, or a
    registry at its commit); with --fits HOST, whether each would pass the gate there and how it fits
    the host's memory. A registry's experimental recipes are listed with --all only, as sparkrun lists
    them; how many were left out, and a registry's files that were refused, are counted below the table."""
    from provision import recipes, report
    from provision.recipes import registry as registries
    from provision.taskargs import load_inventory, profile_named

    inv = load_inventory(inventory) if fits else None
    chosen = profile_named(profile) or (inv.host(fits).profile if inv is not None and fits else None)
    shipped = [] if registry not in (None, "shipped") else list(recipes.load_recipes().values())
    contents, broken = ([], []) if registry == "shipped" else (
        ([registries.read(registries.named(registry))], []) if registry else registries.everything())
    origins = {recipe.name: "shipped" for recipe in shipped}
    origins.update({item.recipe.name: f"{item.registry.name} at {item.registry.commit[:12]}"
                    + (" (experimental)" if registries.is_experimental(item.path) else "")
                    for content in contents for item in content.recipes})
    experimental = {item.recipe.name for content in contents for item in content.recipes
                    if registries.is_experimental(item.path)}
    from_registries = [item.recipe for content in contents for item in content.recipes]
    # A registry's recipes are judged wherever asked (that is what --fits is for); --profile still filters.
    found = [recipe for recipe in shipped if chosen is None or recipe.hardware.profile in (chosen.name, *chosen.aliases)]
    found += [recipe for recipe in from_registries if profile is None or chosen is None
              or recipe.hardware.profile in (chosen.name, *chosen.aliases)]
    hidden = 0 if all_ else sum(1 for recipe in found if recipe.name in experimental)
    found = [recipe for recipe in found if all_ or recipe.name not in experimental]
    fitted = _fitted(inv, fits, found, resolve_wheels=False) if inv is not None and fits else None
    if json_:
        sources = {item.recipe.name: report.registry_recipe_json(item)
                   for content in contents for item in content.recipes}
        print(report.dump_json([{**report.recipe_json(recipe), "from": sources.get(recipe.name, "shipped"),
                                 "experimental": recipe.name in experimental,
                                 **({"fits": report.fit_json(fitted[recipe.name])} if fitted else {})}
                                for recipe in found]))
    else:
        out = report.console()
        report.print_recipes(found, out, fits, fitted, origins)
        if hidden:
            given = {"--profile": profile, "--fits": fits, "--inventory": inventory, "--registry": registry}
            again = " ".join(f"{flag} {shlex.quote(value)}" for flag, value in given.items() if value)
            report.print_hidden_experimental(hidden, f"recipe.list {again} --all" if again else "recipe.list --all",
                                             out)
        for content in contents:
            report.print_registry_counts(content, out)
    _exit_if_broken(broken)


@task(auto_shortflags=False, name="show",
      help=help_for("json", "inventory", name="a recipe's name, or a recipe file", host=FITS_HELP))
@guarded
def show(c: Context, name: str, host: str | None = None, inventory: str | None = None, json_: bool = False) -> None:
    """Show one recipe: its settings, hardware and figures.

    Its settings as an inventory's vars, the hardware, each figure and where it comes from; with
    --host, whether it would pass the gate there and how it fits the host's memory."""
    from provision import report
    from provision.recipes import registry as registries
    from provision.taskargs import load_inventory

    recipe = registries.find(_given(name, "recipe.show", "NAME"))
    fitted = _fitted(load_inventory(inventory), host, [recipe]) if host else None
    if json_:
        print(report.dump_json({**report.recipe_json(recipe),
                                **({"fits": report.fit_json(fitted[recipe.name])} if fitted else {})}))
    else:
        report.print_recipe(recipe, report.console(), host, fitted[recipe.name] if fitted else None)


def _fitted(inv: Any, host: str, found: list[Any], resolve_wheels: bool = True) -> dict[str, Any]:
    """Each recipe's gate on `host`: its settings as the command line's (the host's own layers below
    them), as `invoke check --host HOST --set ...` would judge them, over one SSH connection. Contacts
    the host, changes nothing."""
    from provision import remote, run

    target = inv.host(host)
    pool = remote.Pool(inv.ssh)
    try:
        return {recipe.name: run.gate(inv, [target], run.Options(overrides=recipe.inventory_vars(), quiet=True,
                                                                   resolve_wheels=resolve_wheels), pool)
                for recipe in found}
    finally:
        pool.close()


@task(auto_shortflags=False, name="import", iterable=["set_"],
      help=help_for("json", path="a Spark Arena v2 recipe file, a checkout of its registry (every v2 file in it), "
                                 "or its git URL (cloned with this machine's git, then read as a checkout)",
                    set="a setting the recipe cannot give, KEY=VALUE (repeatable): the venv's pin above all, "
                        "engine_spec=vllm==X.Y.Z, where the container's name does not say it",
                    output="write the recipe (ours) to this file; never overwrites (a file only)"))
@guarded
def import_(c: Context, path: str, set_: list[str] | None = None, output: str | None = None,
            json_: bool = False) -> None:
    """Read Spark Arena's v2 recipes as they are.

    The command's placeholders expanded into settings and server flags, the container's engine version into a venv pin where its name says it, and every
    part with no bare-metal meaning named. Exit 2 if the file cannot be used here (it says why)."""
    from provision import inventory, recipes, report
    from provision.recipes import sparkarena

    overrides = inventory.parse_overrides(set_ or [])
    named = _given(path, "recipe.import", "PATH")
    if is_git_url(named):
        import tempfile

        from provision.recipes import registry as registries

        if output:
            raise RecipeError("--output takes one recipe: a registry's URL holds many", file="command line")
        with tempfile.TemporaryDirectory(prefix="provision-registry-") as work:
            registries.git("clone", "--quiet", "--depth", "1", "--", named, str(Path(work) / "registry"))
            results, skipped = _import_tree(Path(work) / "registry", overrides)
        _print_tree(results, skipped, json_)
        return
    given = Path(named)
    if given.is_dir():
        if output:
            raise RecipeError("--output takes one recipe: name a file, not a directory", file="command line")
        results, skipped = _import_tree(given, overrides)
        _print_tree(results, skipped, json_)
        return
    imported = sparkarena.read(_read(given), str(given), given.stem, overrides)
    if json_:
        print(report.dump_json(report.imported_json(imported)))
    else:
        report.print_imported(imported, report.console())
    if imported.recipe is None:
        raise RecipeError(f"not imported: {imported.refused}", file=str(given))
    if output:
        _write_new(Path(output), recipes.to_yaml(imported.recipe))


@task(auto_shortflags=False, name="export",
      help={"name": "a recipe's name, or a recipe file",
            "format": f"the file written: {' or '.join(FORMATS)} (Spark Arena's v2, where the engine and "
                      "settings fit it)",
            "container": "the image a Spark Arena recipe runs (default: vLLM's release image of the recipe's "
                         "vllm==X.Y.Z pin)",
            "output": "the file to write (default: standard output); never overwrites"})
@guarded
def export(c: Context, name: str, format: str = "ours", container: str | None = None,
           output: str | None = None) -> None:
    """Write a recipe to share: ours, or Spark Arena's v2 format.

    Spark Arena's format takes vLLM recipes whose settings fit it."""
    from provision import recipes
    from provision.recipes import registry as registries
    from provision.recipes import sparkarena

    if format not in FORMATS:
        raise RecipeError(f"--format is {' or '.join(FORMATS)}, not {format!r}", file="command line")
    recipe = registries.find(_given(name, "recipe.export", "NAME"))
    text = recipes.to_yaml(recipe) if format == "ours" else sparkarena.write(recipe, container)
    if output:
        _write_new(Path(output), text)
    else:
        print(text, end="")


@host_task("apply", "inventory", "cluster", "json", "accept-new-host-keys", "set", "verbose", "force",
           help={"name": "a recipe's name, or a recipe file",
                 "cluster": "the cluster the recipe is for (its hosts are gated with it)",
                 "set": "a setting in place of the recipe's, KEY=VALUE (repeatable; written with it, and "
                        "said): a model this machine can serve, say",
                 "dry-run": "show the changes and the gate's verdict; write nothing"})
def apply(c: Context, flags: HostFlags, name: str, dry_run: bool = False) -> None:
    """Apply a recipe to a cluster if the gate passes with it.

    The settings each host would change shown first, the gate run on the cluster's hosts with them,
    and only if it passes, applied/CLUSTER.yaml written beside the inventory
    (read above the cluster's own vars; remove it to go back). Exit 1 if the gate refuses a host."""
    from provision import checks, inventory, report, run
    from provision.recipes import applying
    from provision.recipes import registry as registries
    from provision.taskargs import Selection, load_inventory

    recipe = registries.find(_given(name, "recipe.apply", "NAME"))
    cluster = flags.one_cluster("recipe.apply")
    if not cluster:
        raise RecipeError("name the cluster to apply it to: --cluster NAME", file="command line")
    inv = load_inventory(flags.inventory)
    application = applying.plan(inv, cluster, recipe, inventory.parse_overrides(list(flags.set)))
    chosen = Selection(application.applied, application.applied.select(clusters=[cluster]), {})
    gated = run.gate(chosen.inventory, chosen.targets, flags.options(chosen))
    passed = not gated.errors and not any(checks.verdict(found) == "blocked" for found in gated.findings.values())
    written = passed and not dry_run and not application.unchanged
    if written:
        _write_atomically(application.path, application.new_text)
    if flags.json:
        print(report.dump_json(report.application_json(application, gated, passed, written)))
    else:
        where = f"--inventory {shlex.quote(flags.inventory)}" if flags.inventory else ""
        report.print_application(application, gated, passed, dry_run, where, report.console())
    exit_unless(passed)


def _write_atomically(path: Path, text: str) -> None:
    from provision import datafiles
    try:
        datafiles.write_whole(path, text)
    except OSError as exc:
        raise RecipeError(f"cannot write: {exc.strerror or exc}", file=str(path)) from exc


def _given(value: str, task_name: str, what: str) -> str:
    """The positional argument, which Invoke fills with whatever comes next, -h included: -h and --help
    print the task's help (as for every other task) and end."""
    if value in ("-h", "--help"):
        from invoke.program import Program

        # The help of this module's own task, as `--help recipe.NAME` prints it from the whole collection.
        Program(namespace=Collection(recipe_tasks, registry_tasks)).run(
            [hints.command_name(), "--help", task_name], exit=False)
        raise SystemExit(0)
    if value.startswith("-"):
        raise RecipeError(f"`{hints.command(f'{task_name} {what}')}` takes the {what} first (its help: "
                          f"`{hints.command(f'--help {task_name}')}`), not {value!r}", file="command line")
    return value


GIT_URL = ("https://", "http://", "ssh://", "git://", "file://", "git@")


def is_git_url(text: str) -> bool:
    """A registry's git URL rather than a path: https://github.com/spark-arena/recipe-registry(.git),
    git@host:org/repo.git, ssh://, git://, file:// (a local repository)."""
    return text.startswith(GIT_URL)


def _print_tree(results: list[Imported], skipped: list[str], json_: bool) -> None:
    """A checkout's imports, one row each; exit 1 where any recipe file was refused (counted on stderr)."""
    import sys

    from provision import report

    if json_:
        print(report.dump_json({"recipes": [report.imported_json(item) for item in results], "not_v2": skipped}))
    else:
        report.print_imports(results, skipped, report.console())
    refused = sum(1 for item in results if item.recipe is None)
    if refused:
        print(f"{refused} of {len(results)} recipe file(s) not imported (each says why above)", file=sys.stderr)
    exit_unless(not refused)


def _read(path: Path) -> bytes:
    try:
        with path.open("rb") as stream:
            data = stream.read(256 * 1024 + 1)
    except OSError as exc:
        raise RecipeError(f"cannot read: {exc.strerror or exc}", file=str(path)) from exc
    if len(data) > 256 * 1024:
        raise RecipeError("larger than 256 KiB: not a recipe", file=str(path))
    return data


def _import_tree(root: Path, overrides: dict[str, Any]) -> tuple[list[Imported], list[str]]:
    """Every v2 recipe under `root` (sorted), and the YAML files that are not one, each with why."""
    from provision.recipes import registry, sparkarena

    files = registry.yaml_files(root)
    results: list[Imported] = []
    skipped: list[str] = []
    for path in files:
        relative = str(path.relative_to(root))
        try:
            results.append(sparkarena.read(_read(path), relative, path.stem, overrides))
        except RecipeError as exc:  # registry.yaml, benchmark profiles: not recipes
            skipped.append(f"{relative}: {exc.message}")
    if not results:
        raise RecipeError("no sparkrun recipe (Spark Arena's recipe_version \"2\" or eugr's \"1\") in this directory",
                          file=str(root))
    return results, skipped


def _write_new(path: Path, text: str) -> None:
    try:
        with path.open("x", encoding="utf-8") as stream:
            stream.write(text)
    except FileExistsError:
        raise RecipeError("exists already: never overwritten (name another file)", file=str(path)) from None
    except OSError as exc:
        raise RecipeError(f"cannot write: {exc.strerror or exc}", file=str(path)) from exc
    print(f"wrote {path}")


@task(auto_shortflags=False, name="add",
      help=help_for("json", url="the registry's git URL (https://, ssh://, git@, file://): cloned with this "
                                "machine's git and credentials; a URL holding a password is refused",
                    name="its name here, what its recipes' names start with (NAME/...); default: the URL's "
                         "last part (recipe-registry for .../spark-arena/recipe-registry.git)"))
@guarded
def registry_add(c: Context, url: str, name: str = "", json_: bool = False) -> None:
    """Add a recipe registry: clone it and read its recipes.

    The clone is kept under the user's data directory, and `recipe.list` shows its recipes beside the
    shipped ones, each named NAME/FILE and read at the clone's commit. A registry holding no recipe is
    not added (exit 2)."""
    from provision import report
    from provision.recipes import registry as registries

    given = _given(url, "registry.add", "URL")
    added = registries.add(name or registries.name_of(given), given)
    contents = registries.read(added)
    if json_:
        print(report.dump_json(report.registry_json(contents)))
    else:
        report.print_registries([contents], report.console())


@task(auto_shortflags=False, name="list", help=help_for("json"))
@guarded
def registry_list(c: Context, json_: bool = False) -> None:
    """List the registries: URL, commit, recipes read.

    Per registry, its recipes read and refused (each refused file with why); with --json, also each
    file that is no recipe."""
    from provision import report
    from provision.recipes import registry as registries

    everything, broken = registries.everything()
    if json_:
        print(report.dump_json([report.registry_json(contents) for contents in everything]))
    else:
        report.print_registries(everything, report.console())
    _exit_if_broken(broken)


def _exit_if_broken(broken: list[RecipeError]) -> None:
    """After a listing: each registry that could not be read, on stderr, and exit 1."""
    import sys

    for error in broken:
        print(f"error: {error.message}", file=sys.stderr)
    exit_unless(not broken)


@task(auto_shortflags=False, name="update", iterable=["name"],
      help=help_for("json", name="a registry to update (repeatable; default: every registry)"))
@guarded
def registry_update(c: Context, name: list[str] | None = None, json_: bool = False) -> None:
    """Fetch the registries again, each at its remote's head.

    The commit before and after and the recipe files changed, per registry. One that cannot be fetched
    is said and the others are still updated (exit 1)."""
    from provision import report
    from provision.recipes import registry as registries

    results = registries.update(name or [])
    if json_:
        print(report.dump_json([report.update_json(result) for result in results]))
    else:
        report.print_updates(results, report.console())
    exit_unless(not any(isinstance(result, RecipeError) for result in results))


@task(auto_shortflags=False, name="remove", help={"name": "the registry to remove (its clone is deleted)"})
@guarded
def registry_remove(c: Context, name: str) -> None:
    """Remove a registry: its clone and its entry.

    Clusters it was applied to keep their applied/CLUSTER.yaml (the settings were copied there)."""
    from provision.recipes import registry as registries

    removed = registries.remove(_given(name, "registry.remove", "NAME"))
    print(f"removed registry {removed.name} ({removed.url})")


recipe_tasks = Collection("recipe", list_, show, import_, export, apply)
registry_tasks = Collection("registry", registry_add, registry_list, registry_update, registry_remove)
