"""Defaults and the environment: the only module that reads environment variables.

    PROVISION_INVENTORY   inventory file or directory used when --inventory is not given
    PROVISION_LAB_DIR     where the lab keeps its hosts, key, known_hosts and inventory
                          (default /var/lib/provision-lab)
    PROVISION_LAB_CACHE   where the lab caches its base root filesystem (default /var/cache/provision-lab)
    PROVISION_LAB_SUBNET  the lab's private /24 (default 10.231.77.0/24)
    PROVISION_LAB_MIRROR  Debian mirror for the lab's base (default: the first one in this machine's apt sources)
    PROVISION_LOG         a file to append the tool's debug log to (secrets masked)
    PROVISION_WHEELHOUSE  where the controller keeps resolved wheels (default /var/cache/provision/wheelhouse)
    PROVISION_MODEL_CONFIGS  where it keeps models' config.json, and pinned commits' file lists, by commit
                             (default /var/cache/provision/model-configs)
"""
from __future__ import annotations

import os
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


def default_inventory() -> Path:
    """--inventory's default: $PROVISION_INVENTORY, else the lab's while it is up, else ./inventory/."""
    explicit = os.environ.get("PROVISION_INVENTORY")
    if explicit:
        return Path(explicit)
    if lab_inventory().exists():
        return lab_inventory()
    return REPO_INVENTORY


def inventory_lookup() -> list[tuple[str, Path | None]]:
    """Where default_inventory() looks, in its order: (what the place is, its path; None: not set)."""
    explicit = os.environ.get("PROVISION_INVENTORY")
    return [("$PROVISION_INVENTORY", Path(explicit) if explicit else None),
            ("the lab's inventory, while the lab is up", lab_inventory()),
            ("./inventory/ in the current directory", Path.cwd() / REPO_INVENTORY)]


def wheelhouse() -> Path:
    return Path(os.environ.get("PROVISION_WHEELHOUSE", "/var/cache/provision/wheelhouse"))


def model_configs() -> Path:
    """A commit's config.json and files never change: read once from the hub, kept here by repository
    and commit."""
    return Path(os.environ.get("PROVISION_MODEL_CONFIGS", "/var/cache/provision/model-configs"))


NCCL_PORT = 29500  # verify.nccl's rendezvous port on the head: torchrun's default
