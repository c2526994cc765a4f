"""Malformed inventories generated in bulk: every one gets one clear InventoryError (file, and where it
can be told, line and key) and never a traceback; valid ones load. Nothing is contacted: load() only
reads files."""
from __future__ import annotations

import string
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provision import inventory
from provision.errors import InventoryError

NAMES = st.text(alphabet=string.ascii_lowercase + string.digits + "-_. /:", min_size=0, max_size=12)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10, 70000), st.floats(allow_nan=True),
                    NAMES, st.sampled_from(["rtx5090", "dgx-spark", "cpu", "hopper", "10.0.0.1", "ssh", "local",
                                            "0.5", "auto", "ccd:1", "0-5", "/opt/x", "main"]))
KEYS = st.sampled_from(["address", "port", "user", "profile", "connection", "key_file", "vars", "hosts", "head",
                        "model", "bind_host", "tensor_parallel_size", "gpu_memory_utilization", "environment",
                        "extra_args", "cpu_affinity", "known_hosts", "connect_timeout", "bogus", "secrets"])
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(KEYS, inner, max_size=4)), max_leaves=12)
DOCUMENTS = st.dictionaries(st.sampled_from(["ssh", "hosts", "groups", "clusters", "secrets", "extra"]),
                            st.dictionaries(NAMES, VALUES, max_size=3) | VALUES, max_size=4)


def _load(tmp_path: Path, text: str) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    try:
        inventory.load(path)
    except InventoryError as exc:
        message = str(exc)
        assert message and "\n" not in message.strip() and "Traceback" not in message
        assert str(path) in message  # the error names the file


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(DOCUMENTS)
def test_generated_documents_load_or_fail_with_one_clear_message(tmp_path: Path, document: dict) -> None:
    _load(tmp_path, yaml.safe_dump(document))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=string.printable, max_size=200))
def test_arbitrary_text_never_raises_anything_but_an_inventory_error(tmp_path: Path, text: str) -> None:
    _load(tmp_path, text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 400), st.sampled_from(["\t", ":", "- ", "{", "]", "&a", "*a", "!!python/object:os.system ''",
                                              "\x00", "key: value\nkey: again"]))
def test_a_valid_inventory_broken_anywhere_fails_cleanly(tmp_path: Path, where: int, junk: str) -> None:
    good = (Path(__file__).parents[1] / "inventory" / "hosts.yaml").read_text()
    where = min(where, len(good))
    _load(tmp_path, good[:where] + junk + good[where:])
