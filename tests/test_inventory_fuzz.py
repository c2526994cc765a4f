"""Malformed inventories generated in bulk: every one gets one clear InventoryError (file, and where it
can be told, line and key) and never a traceback; valid ones load. Hostile ones too (alias bombs,
self-referring aliases, nesting hundreds deep), and every example, hostile or not, answers within a
second and 50 MB of Python memory. Nothing is contacted: load() only reads files."""
from __future__ import annotations

import itertools
import string
import time
import tracemalloc
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provision import inventory
from provision.errors import InventoryError
from provision.profiles import load_profiles

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


SECONDS = 1.0  # per example, as the inventory's own bounds promise (provision/inventory.py)
MEMORY = 50 * 2**20  # bytes of Python memory at the peak, as tracemalloc counts them
PROFILES = load_profiles()  # read once: each example then measures the inventory alone


def _load(tmp_path: Path, text: str) -> inventory.Inventory | InventoryError:
    """load() on the text: an Inventory or one clear InventoryError, within the time and memory bound."""
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    tracemalloc.start()
    # This process's CPU time, not the wall clock: the suite's other workers share the machine's cores,
    # and the bound is on the loader's own work.
    start = time.process_time()
    try:
        answer: inventory.Inventory | InventoryError = inventory.load(path, PROFILES)
    except InventoryError as exc:
        answer = exc
    finally:
        elapsed = time.process_time() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < SECONDS, f"{elapsed:.2f} s"
    assert peak < MEMORY, f"{peak / 2**20:.0f} MB"
    if isinstance(answer, InventoryError):
        message = str(answer)
        assert message and "\n" not in message.strip() and "Traceback" not in message
        assert str(path) in message  # the error names the file
        assert len(message) < len(str(path)) + 400  # whatever the file holds, the message stays short
    return answer


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(DOCUMENTS)
def test_generated_documents_load_or_fail_with_one_clear_message(tmp_path: Path, document: dict) -> None:
    _load(tmp_path, yaml.safe_dump(document))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=string.printable, max_size=200))
def test_arbitrary_text_never_raises_anything_but_an_inventory_error(tmp_path: Path, text: str) -> None:
    _load(tmp_path, text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 400), st.sampled_from(["\t", ":", "- ", "{", "]", "&a", "*a", "!!python/object:os.system ''",
                                              "\x00", "key: value\nkey: again"]))
def test_a_valid_inventory_broken_anywhere_fails_cleanly(tmp_path: Path, where: int, junk: str) -> None:
    good = (Path(__file__).parents[1] / "inventory" / "hosts.yaml").read_text()
    where = min(where, len(good))
    _load(tmp_path, good[:where] + junk + good[where:])


# Hostile documents. Each is written as YAML text: aliases and nesting are what a dumper avoids.

PLACES = [  # where a hostile value stands: each place is read by a different check
    "hosts:\n  h:\n    profile: cpu\n    address: VALUE\n",
    "hosts:\n  h: {address: 10.0.0.1, profile: cpu, vars: {extra_args: VALUE}}\n",
    "hosts:\n  h: {address: 10.0.0.1, profile: cpu, vars: {environment: VALUE}}\n",
    "hosts:\n  h: {address: 10.0.0.1, profile: cpu}\ngroups:\n  g: {hosts: VALUE}\n",
    "hosts:\n  h: {address: 10.0.0.1, profile: cpu}\nclusters:\n  c: {hosts: [h], head: VALUE}\n",
    "ssh: {connect_timeout: VALUE}\nhosts:\n  h: {address: 10.0.0.1, profile: cpu}\n",
    "hosts:\n  h: {address: 10.0.0.1, profile: cpu}\n? VALUE\n: 1\n",
    "VALUE\n",
]


@st.composite
def alias_bombs(draw: st.DrawFn) -> tuple[str, int, int]:
    """Anchors each made of FAN_OUT uses of the one before, DEPTH of them, as lists, mappings or
    merges; returns the document, at least how many values it stands for, and the bomb's line."""
    fan_out, depth = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    style = draw(st.sampled_from(["list", "mapping", "merge"]))
    names = [f"a{level}" for level in range(depth)]

    def level(items: list[str]) -> str:
        if style == "list":
            return "[" + ", ".join(items) + "]"
        if style == "mapping":
            return "{" + ", ".join(f"k{i}: {item}" for i, item in enumerate(items)) + "}"
        return "{<<: [" + ", ".join(items) + "]}" if items[0].startswith("*") else \
            "{" + ", ".join(f"k{i}: {item}" for i, item in enumerate(items)) + "}"

    anchors = [f"&{names[0]} " + level(["lol"] * fan_out)]
    anchors += [f"&{name} " + level([f"*{before}"] * fan_out) for before, name in itertools.pairwise(names)]
    value = "[" + ", ".join(anchors) + "]"
    stands_for = sum(fan_out ** (i + 1) for i in range(depth))  # the scalars alone
    place = draw(st.sampled_from(PLACES))
    return place.replace("VALUE", value), stands_for, _line_of_value(place)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(alias_bombs())
def test_alias_bombs_are_refused_quickly_at_the_alias(tmp_path: Path, case: tuple[str, int, int]) -> None:
    text, stands_for, line = case
    answer = _load(tmp_path, text)
    assert isinstance(answer, InventoryError)  # no place takes a list or mapping of "lol"s
    if stands_for > inventory.MAX_INVENTORY_VALUES:
        assert f"past {inventory.MAX_INVENTORY_VALUES} values" in str(answer)
        assert answer.line == line, str(answer)  # the bomb's own line


def _line_of_value(place: str) -> int:
    """The line of PLACE that the hostile value stands on, all of it."""
    return place[:place.index("VALUE")].count("\n") + 1


def _nest(opens: list[str], inner: str) -> str:
    return "".join(opens) + inner + "".join("]" if o == "[" else "}" for o in reversed(opens))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(50, 500), st.lists(st.sampled_from(["[", "{k: ", "- "]), min_size=1, max_size=6),
       st.sampled_from(PLACES))
def test_nesting_hundreds_deep_is_refused_not_a_recursion_error(tmp_path: Path, depth: int, pattern: list[str],
                                                                place: str) -> None:
    """Lists and mappings inside each other DEPTH deep, the pattern of openings repeated; "- " is a
    block sequence ("- - - x" nests on one line), so it gets a line of its own."""
    if "- " in pattern:
        text = "hosts:\n  h:\n    profile: cpu\n    address:\n      " + "- " * depth + "x\n"
    else:
        text = place.replace("VALUE", _nest((pattern * depth)[:depth], "x"))
    answer = _load(tmp_path, text)
    assert isinstance(answer, InventoryError)
    assert f"more than {inventory.MAX_INVENTORY_DEPTH} levels deep" in str(answer)
    assert answer.line == (5 if "- " in pattern else _line_of_value(place)), str(answer)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 40), st.integers(0, 40), st.sampled_from(["[", "{k: "]))
def test_an_alias_cannot_carry_nesting_past_the_bound(tmp_path: Path, anchored: int, around: int,
                                                      opens: str) -> None:
    """An anchor of ANCHORED levels used AROUND levels inside extra_args (itself 5 levels down)."""
    text = (f"defs: &deep {_nest([opens] * anchored, 'x')}\n"
            + PLACES[1].replace("VALUE", _nest(["["] * (around + 1), "*deep")))
    answer = _load(tmp_path, text)
    assert isinstance(answer, InventoryError)
    deepest = 5 + around + anchored + 1  # the alias's value sits 5 + around deep; "x" one further
    if deepest > inventory.MAX_INVENTORY_DEPTH:
        assert "levels deep" in str(answer)
    else:
        assert "unknown key" in str(answer)  # "defs:" is no inventory key: refused only after reading


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["&a [*a]", "&a {k: *a}", "&a [x, [y, *a]]", "&a {<<: *a}", "&a [*b]", "*a"]),
       st.sampled_from(PLACES))
def test_self_referring_and_undefined_aliases_fail_cleanly(tmp_path: Path, value: str, place: str) -> None:
    answer = _load(tmp_path, place.replace("VALUE", value))
    assert isinstance(answer, InventoryError)
    assert "is used inside the value it names" in str(answer) or "undefined alias" in str(answer), str(answer)


SETTINGS = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B-Instruct"]),
    "port": st.integers(1, 65535), "tensor_parallel_size": st.integers(1, 8),
    "extra_args": st.lists(st.sampled_from(["--enforce-eager", "--max-num-seqs", "64"]), max_size=3),
    "environment": st.dictionaries(st.sampled_from(["NCCL_DEBUG", "VLLM_LOGGING_LEVEL"]),
                                   st.sampled_from(["INFO", "WARN", "1"]), max_size=2),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 30), SETTINGS)
def test_settings_shared_through_an_anchor_load_for_every_host(tmp_path: Path, hosts: int,
                                                               shared: dict) -> None:
    """The ordinary use of aliases: one anchored mapping of settings, used by every host."""
    document = {"hosts": {f"h{i}": {"address": f"10.0.0.{i + 1}", "profile": "cpu", "vars": shared}
                          for i in range(hosts)}}
    text = yaml.safe_dump(document)  # the dumper writes the shared mapping once, then aliases
    assert hosts == 1 or not shared or "*id" in text
    answer = _load(tmp_path, text)
    assert isinstance(answer, inventory.Inventory), answer
    for i in range(hosts):
        settings_ = answer.settings(f"h{i}")
        assert {key: settings_.values[key] for key in shared if key != "environment"} == {
            key: tuple(value) if key == "extra_args" else value for key, value in shared.items()
            if key != "environment"}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(VALUES, min_size=1, max_size=4), st.data())
def test_generated_documents_with_shared_values_load_or_fail_with_one_clear_message(
        tmp_path: Path, pool: list, data: st.DataObject) -> None:
    """Documents where the same lists and mappings appear in several places: the dumper writes them as
    anchors and aliases."""
    shared = st.sampled_from(pool)
    document = data.draw(st.dictionaries(
        st.sampled_from(["ssh", "hosts", "groups", "clusters", "extra"]),
        st.dictionaries(NAMES, shared | st.dictionaries(KEYS, shared, max_size=4), max_size=3) | shared,
        max_size=4))
    _load(tmp_path, yaml.safe_dump(document))
