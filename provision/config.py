"""Defaults and the environment: the only module that reads environment variables.

    PROVISION_INVENTORY   inventory file or directory used when --inventory is not given
    PROVISION_LAB         1: the lab's inventory is the default wherever the tool runs (without it, only
                          in the checkout that brought the lab up)
    PROVISION_LAB_DIR     where the lab keeps its hosts, key, known_hosts and inventory
                          (default /var/lib/provision-lab)
    PROVISION_LAB_CACHE   where the lab caches its base root filesystem (default /var/cache/provision-lab)
    PROVISION_LAB_SUBNET  the lab's private /24 (default 10.231.77.0/24)
    PROVISION_LAB_MIRROR  Debian mirror for the lab's base (default: the first one in this machine's apt sources)
    PROVISION_LOG         a file to append the tool's debug log to (secrets masked)
    PROVISION_WHEELHOUSE  where the controller keeps resolved wheels (default /var/cache/provision/wheelhouse)
    PROVISION_MODEL_CONFIGS  where it keeps models' config.json, and pinned commits' file lists, by commit
                             (default /var/cache/provision/model-configs)
    PROVISION_DATA_DIR    the user's own data: the recipe registries added and their clones (default
                          $XDG_DATA_HOME/provision, else ~/.local/share/provision)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_INVENTORY = Path("inventory")


def lab_dir() -> Path:
    return Path(os.environ.get("PROVISION_LAB_DIR", "/var/lib/provision-lab"))


def lab_cache() -> Path:
    return Path(os.environ.get("PROVISION_LAB_CACHE", "/var/cache/provision-lab"))


def lab_subnet() -> str:
    return os.environ.get("PROVISION_LAB_SUBNET", "10.231.77.0/24")


def lab_mirror() -> str | None:
    return os.environ.get("PROVISION_LAB_MIRROR")


def log_file() -> str | None:
    return os.environ.get("PROVISION_LOG")


def lab_inventory() -> Path:
    return lab_dir() / "inventory.yaml"


def lab_owner_file() -> Path:
    """Where `lab.up` records the checkout it ran from (see lab_owner)."""
    return lab_dir() / "checkout"


def checkout() -> Path | None:
    """The source checkout this tool runs from (tasks.py and pyproject.toml beside the package), or
    None for an installed one."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "tasks.py").is_file() and (root / "pyproject.toml").is_file() else None


def lab_owner() -> Path | None:
    """The checkout that brought the lab up last (its lab.up recorded it), or None: no lab, or one
    brought up by an installed tool."""
    try:
        text = lab_owner_file().read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return Path(text) if text else None


def lab_asked() -> bool:
    return os.environ.get("PROVISION_LAB", "") not in ("", "0")


@dataclass(frozen=True)
class Place:
    """One place the default inventory is looked for: what it is, its path (None: not set), and why it
    does not count here (None: it does)."""

    what: str
    path: Path | None
    passed_over: str | None = None


def inventory_lookup(cwd: Path | None = None) -> list[Place]:
    """Where default_inventory() looks, in its order. The lab's inventory counts where it was asked for
    ($PROVISION_LAB=1) or in the checkout that brought the lab up: the lab is this machine's, and an
    operator's `provision status` elsewhere must not read it by surprise."""
    here = (cwd or Path.cwd()).resolve()
    explicit = os.environ.get("PROVISION_INVENTORY")
    owner = lab_owner()
    if lab_asked():
        lab = Place("the lab's inventory ($PROVISION_LAB=1; `lab.up` writes it)", lab_inventory())
    elif not lab_inventory().exists():
        lab = Place("the lab's inventory, while the lab is up (in the checkout that brought it up, or with "
                    "$PROVISION_LAB=1)", lab_inventory())
    elif owner is not None and here.is_relative_to(owner.resolve()):
        lab = Place(f"the lab's inventory (this checkout, {owner}, brought the lab up)", lab_inventory())
    else:
        brought = f"the checkout {owner}" if owner else "an installed tool, not a checkout"
        lab = Place("the lab's inventory", lab_inventory(),
                    f"not used here: the lab was brought up by {brought}; $PROVISION_LAB=1 uses it anywhere")
    return [Place("$PROVISION_INVENTORY", Path(explicit) if explicit else None), lab,
            Place("./inventory/ in the current directory", here / REPO_INVENTORY)]


def default_inventory(cwd: Path | None = None) -> Path:
    """--inventory's default: $PROVISION_INVENTORY; else the lab's, where it counts (inventory_lookup)
    and it is up (with $PROVISION_LAB=1: whether up or not, so that its absence is what is said);
    else ./inventory/."""
    explicit, lab, _ = inventory_lookup(cwd)
    if explicit.path is not None:
        return explicit.path
    if lab.passed_over is None and lab.path is not None and (lab.path.exists() or lab_asked()):
        return lab.path
    return REPO_INVENTORY


def wheelhouse() -> Path:
    return Path(os.environ.get("PROVISION_WHEELHOUSE", "/var/cache/provision/wheelhouse"))


def model_configs() -> Path:
    """A commit's config.json and files never change: read once from the hub, kept here by repository
    and commit."""
    return Path(os.environ.get("PROVISION_MODEL_CONFIGS", "/var/cache/provision/model-configs"))


def data_dir() -> Path:
    """The user's data directory (the XDG base directory rule): what they added, kept between runs."""
    given = os.environ.get("PROVISION_DATA_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "provision"


NCCL_PORT = 29500  # verify.nccl's rendezvous port on the head: torchrun's default
