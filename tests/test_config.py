"""Where the default inventory comes from: $PROVISION_INVENTORY; else the lab's, in the checkout that
brought the lab up or with $PROVISION_LAB=1; else ./inventory/. The lab is this machine's: an operator's
`provision status` in a directory of their own must not read it by surprise."""
from __future__ import annotations

from pathlib import Path

import pytest

from provision import config, lab, taskargs
from provision.errors import InventoryError
from tests.conftest import REPO


@pytest.fixture
def lab_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lab directory holding an inventory, as lab.up leaves it; no PROVISION_INVENTORY, PROVISION_LAB."""
    for name in ("PROVISION_INVENTORY", "PROVISION_LAB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PROVISION_LAB_DIR", str(tmp_path / "lab"))
    (tmp_path / "lab").mkdir()
    config.lab_inventory().write_text("hosts: {}\n")
    return config.lab_inventory()


def owned_by(checkout: Path | None) -> None:
    config.lab_owner_file().write_text(f"{checkout}\n" if checkout else "")


def test_in_the_checkout_that_brought_the_lab_up_its_inventory_is_the_default(
        lab_up: Path, tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "docs").mkdir(parents=True)
    owned_by(checkout)
    assert config.default_inventory(checkout) == lab_up
    assert config.default_inventory(checkout / "docs") == lab_up  # invoke finds tasks.py from below too


def test_elsewhere_the_lab_is_passed_over_and_the_lookup_says_why(lab_up: Path, tmp_path: Path) -> None:
    owned_by(tmp_path / "checkout")
    elsewhere = tmp_path / "operator"
    elsewhere.mkdir()
    assert config.default_inventory(elsewhere) == config.REPO_INVENTORY
    _, place, local = config.inventory_lookup(elsewhere)
    assert place.path == lab_up and place.passed_over == (
        f"not used here: the lab was brought up by the checkout {tmp_path / 'checkout'}; "
        "$PROVISION_LAB=1 uses it anywhere")
    assert local.path == elsewhere / "inventory" and local.passed_over is None


def test_a_lab_brought_up_by_an_installed_tool_is_the_default_nowhere(lab_up: Path, tmp_path: Path) -> None:
    owned_by(None)
    assert config.default_inventory(tmp_path) == config.REPO_INVENTORY
    assert "brought up by an installed tool" in (config.inventory_lookup(tmp_path)[1].passed_over or "")


def test_asked_for_the_lab_is_the_default_anywhere(lab_up: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    owned_by(tmp_path / "checkout")
    monkeypatch.setenv("PROVISION_LAB", "1")
    assert config.default_inventory(tmp_path) == lab_up
    monkeypatch.setenv("PROVISION_INVENTORY", str(tmp_path / "mine.yaml"))  # a file named wins
    assert config.default_inventory(tmp_path) == tmp_path / "mine.yaml"
    monkeypatch.delenv("PROVISION_INVENTORY")
    monkeypatch.setenv("PROVISION_LAB", "0")
    assert config.default_inventory(tmp_path) == config.REPO_INVENTORY


def test_asked_for_while_the_lab_is_down_its_absence_is_the_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROVISION_INVENTORY", raising=False)
    monkeypatch.setenv("PROVISION_LAB_DIR", str(tmp_path / "no-lab"))
    monkeypatch.setenv("PROVISION_LAB", "1")
    monkeypatch.chdir(tmp_path)
    assert config.default_inventory() == tmp_path / "no-lab" / "inventory.yaml"
    with pytest.raises(InventoryError) as missing:
        taskargs.load_inventory(None, local_only=True)  # asked for: even `--host local` says so
    assert (f"  2. the lab's inventory ($PROVISION_LAB=1; `lab.up` writes it): {tmp_path}/no-lab/inventory.yaml: "
            "absent") in str(missing.value)


def test_the_missing_inventory_names_the_lab_that_is_not_used_here(
        lab_up: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    owned_by(tmp_path / "checkout")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InventoryError) as missing:
        taskargs.load_inventory(None)
    assert (f"  2. the lab's inventory: {lab_up}: found, not used here: the lab was brought up by the checkout "
            f"{tmp_path / 'checkout'}; $PROVISION_LAB=1 uses it anywhere") in str(missing.value).splitlines()


def test_lab_up_records_the_checkout_it_ran_from(lab_up: Path) -> None:
    lab.Lab()._write_inventory({"hosts": {}})
    assert config.checkout() == REPO  # these tests run from a checkout
    assert config.lab_owner() == REPO
    assert config.default_inventory(REPO) == lab_up
