"""Inventory loading: every malformed case gives one clear message (file, line, entity, key) and exit
code 2, before anything is contacted; the shipped inventories load; precedence is as documented."""
from __future__ import annotations

import dataclasses
import json
import re
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from provision import catalog, inventory
from provision.errors import InventoryError
from tests.conftest import FIXTURES, REPO

BAD = sorted((FIXTURES / "inventory" / "bad").glob("*.yaml"))


def expectation(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: ")
    return first[len("# expect: "):]


@pytest.mark.parametrize("path", BAD, ids=lambda path: path.stem)
def test_malformed_inventory_names_file_line_and_key(path: Path, tmp_path: Path) -> None:
    broken = tmp_path / path.name
    broken.write_text(path.read_text().replace("LISTENER_PORT", "2222"))
    with pytest.raises(InventoryError) as caught:
        inventory.load(broken)
    message = str(caught.value)
    assert message.startswith(str(broken)), message
    assert re.search(expectation(path), message), message
    assert "\n" not in message


class Listener:
    """A TCP port that records whether anything connected to it."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen()
        self.socket.settimeout(0.2)
        self.port = self.socket.getsockname()[1]
        self.connections = 0
        self.running = True
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while self.running:
            try:
                connection, _ = self.socket.accept()
                self.connections += 1
                connection.close()
            except OSError:
                continue

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.socket.close()


def run_invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.parametrize("path", BAD, ids=lambda path: path.stem)
def test_cli_exits_2_with_one_message_and_contacts_nothing(path: Path, tmp_path: Path) -> None:
    listener = Listener()
    try:
        broken = tmp_path / path.name
        broken.write_text(path.read_text().replace("LISTENER_PORT", str(listener.port)))
        done = run_invoke("facts", "--inventory", str(broken), "--all")
    finally:
        listener.close()
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {broken}"), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert listener.connections == 0


def test_a_valid_inventory_pointing_at_the_listener_does_contact_it(tmp_path: Path) -> None:
    """The control for the test above: the same listener does see a real connection attempt."""
    listener = Listener()
    try:
        good = tmp_path / "good.yaml"
        good.write_text(f"ssh: {{connect_timeout: 2, known_hosts: {tmp_path}/kh}}\nhosts:\n"
                        f"  h: {{address: 127.0.0.1, port: {listener.port}, profile: cpu}}\n")
        done = run_invoke("facts", "--inventory", str(good), "--host", "h")
    finally:
        listener.close()
    assert done.returncode == 1
    assert listener.connections >= 1


def test_example_inventory_describes_the_two_systems() -> None:
    inv = inventory.load(REPO / "inventory")
    workstation = inv.settings("ws-5090")
    assert workstation.tensor_parallel_size == 2 and "AWQ" in workstation.model
    assert inv.host("ws-5090").profile.name == "rtx5090"
    pair = inv.cluster("spark-pair")
    assert pair.multi_node and pair.head == "spark-1"
    assert {inv.host(name).profile.name for name in pair.hosts} == {"dgx-spark"}


def test_precedence_command_line_host_group_cluster_profile(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("""
hosts:
  a: {address: 10.0.0.1, profile: dgx-spark, vars: {port: 8100, environment: {FROM_HOST: "1"}}}
  b: {address: 10.0.0.2, profile: dgx-spark}
groups:
  g: {hosts: [a, b], vars: {port: 8050, max_model_len: 4096, environment: {FROM_GROUP: "1"}}}
clusters:
  c: {hosts: [a, b], vars: {port: 8001, max_model_len: 2048, tensor_parallel_size: 2}}
""")
    inv = inventory.load(path)
    a = inv.settings("a", overrides=inventory.parse_overrides(["port=9000"]))
    assert (a.port, a.origin["port"]) == (9000, "command line")
    assert inv.settings("a").port == 8100
    b = inv.settings("b")
    assert (b.port, b.origin["port"]) == (8050, "group g")
    assert (b.max_model_len, b.tensor_parallel_size) == (4096, 2)
    assert (b.gpu_memory_utilization, b.origin["gpu_memory_utilization"]) == (0.85, "profile dgx-spark")
    assert b.venv_dir == "/opt/vllm/venv" and b.origin["venv_dir"] == "default"
    env = inv.settings("a").environment
    assert env["FROM_HOST"] == env["FROM_GROUP"] == "1"
    assert env["TRITON_PTXAS_PATH"] == "/usr/local/cuda/bin/ptxas"  # from the profile, merged


def test_directory_inventory_refuses_a_name_defined_in_two_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("hosts:\n  h1: {address: 10.0.0.1, profile: cpu}\n")
    (tmp_path / "b.yaml").write_text("hosts:\n  h1: {address: 10.0.0.2, profile: cpu}\n")
    with pytest.raises(InventoryError, match=r"b.yaml:2: host 'h1': defined twice \(also in .*a.yaml\)"):
        inventory.load(tmp_path)


def test_bad_command_line_override_is_a_usage_error() -> None:
    with pytest.raises(InventoryError, match="command line: key 'port': expected an integer"):
        inventory.parse_overrides(["port=abc"])
    with pytest.raises(InventoryError, match="expects KEY=VALUE"):
        inventory.parse_overrides(["port"])


def test_hardening_is_default_or_strict() -> None:
    assert inventory.VAR_SPECS["hardening"].default == "default"
    assert inventory.parse_overrides(["hardening=strict"]) == {"hardening": "strict"}
    with pytest.raises(InventoryError, match="key 'hardening': expected one of default, strict, got 'paranoid'"):
        inventory.parse_overrides(["hardening=paranoid"])


def test_a_gpu_profile_must_say_which_device_nodes_it_opens(tmp_path: Path) -> None:
    import yaml

    from provision.errors import ProfileError
    from provision.profiles import PROFILE_DIR, profile_from_mapping

    data = yaml.safe_load((PROFILE_DIR / "rtx5090.yaml").read_text())
    assert profile_from_mapping(data, "rtx5090.yaml").devices[0][0] == "char-nvidia rw"
    without = {k: v for k, v in data.items() if k != "devices"}
    with pytest.raises(ProfileError, match="a GPU profile must list the device nodes"):
        profile_from_mapping(without, "site.yaml")
    with pytest.raises(ProfileError, match="not a DeviceAllow= entry.*: /dev/nvidia\\* rw"):
        profile_from_mapping({**data, "devices": {"/dev/nvidia* rw": "globs are for group names"}}, "site.yaml")
    cpu = yaml.safe_load((PROFILE_DIR / "cpu.yaml").read_text())
    assert profile_from_mapping(cpu, "cpu.yaml").devices == ()


@pytest.mark.parametrize(("defaults", "said"), [
    ({"tensor_paralel_size": 1}, r"site\.yaml: defaults: key 'tensor_paralel_size': unknown setting \(known: "),
    ({"gpu_memory_utilization": 1.5}, r"site\.yaml: defaults: key 'gpu_memory_utilization': expected a number in \(0, 1\]"),
], ids=["unknown-key", "refused-value"])
def test_a_profiles_defaults_are_held_to_the_settings_table(defaults: dict, said: str) -> None:
    """Settings.of takes only the table's keys: a misspelt default would vanish, a bad one pass."""
    import yaml

    from provision.errors import ProfileError
    from provision.profiles import PROFILE_DIR, load_profiles, profile_from_mapping

    data = yaml.safe_load((PROFILE_DIR / "cpu.yaml").read_text())
    site = profile_from_mapping({**data, "name": "site", "defaults": {**data["defaults"], **defaults}}, "site.yaml")
    with pytest.raises(ProfileError, match=said):
        inventory.load(REPO / "inventory", profiles={**load_profiles(), "site": site})
    inventory.check_profile_defaults(load_profiles())  # the shipped ones hold


def test_unknown_host_and_missing_inventory_are_clear() -> None:
    inv = inventory.load(REPO / "inventory")
    with pytest.raises(InventoryError, match="unknown host 'nope'"):
        inv.host("nope")
    assert inv.host("local").connection == "local"
    with pytest.raises(InventoryError, match="no such file or directory"):
        inventory.load("/nonexistent/inventory.yaml")


def timed_load(path: Path) -> tuple[inventory.Inventory | InventoryError, float, int]:
    """What load() answers, in how many seconds, at what peak of Python memory (bytes)."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        answer: inventory.Inventory | InventoryError = inventory.load(path)
    except InventoryError as exc:
        answer = exc
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return answer, elapsed, peak


def test_the_alias_bomb_is_refused_at_its_alias_in_a_second_and_little_memory(tmp_path: Path) -> None:
    """The billion laughs: nine anchors, each nine uses of the one before, 9**9 strings in 480 bytes.
    Unbounded, its error message built the repr() of all of them: 39 s and 5.7 GB of memory."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text((FIXTURES / "inventory" / "bad" / "alias-bomb.yaml").read_text())
    answer, elapsed, peak = timed_load(bomb)
    assert isinstance(answer, InventoryError)
    assert str(answer) == (f"{bomb}:10: alias *d takes the inventory past 40000 values "
                           "(each use of an alias counts all the values it names)")
    assert elapsed < 1.0 and peak < 50 * 2**20, (elapsed, peak)


def test_a_value_shown_in_an_error_is_cut_short_however_large() -> None:
    """A value that stands for 9**9 others (as aliases build it) is shown in a few characters."""
    value: object = ["lol"] * 9
    for _ in range(8):
        value = [value] * 9
    start = time.perf_counter()
    with pytest.raises(InventoryError) as caught:
        inventory.validate_vars({"extra_args": value}, source="inv.yaml", entity="host 'h'")
    assert time.perf_counter() - start < 1.0
    message = str(caught.value)
    assert message.startswith("inv.yaml: host 'h': key 'extra_args': expected a list of strings, got [[")
    assert len(message) < 200, message


def test_a_long_value_a_long_name_and_a_huge_integer_are_shown_short(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(f"hosts:\n  h: {{address: {'a' * 5000}.example, profile: cpu}}\n")
    with pytest.raises(InventoryError, match=r"inv.yaml:2: host 'h': key 'address': not an IP address or "
                                             r"host name: 'aaa+\.\.\.") as caught:
        inventory.load(path)
    assert len(str(caught.value)) < len(str(path)) + 200
    path.write_text(f"hosts:\n  {'n' * 1000}: {{address: 10.0.0.1, profile: cpu}}\n")
    with pytest.raises(InventoryError, match="a name may hold") as caught:
        inventory.load(path)
    assert len(str(caught.value)) < len(str(path)) + 200
    path.write_text(f"hosts:\n  h: {{address: 10.0.0.1, profile: cpu, port: 0x{'f' * 5000}}}\n")
    with pytest.raises(InventoryError, match=r"got <an integer of 20000 bits> \(int\)"):
        inventory.load(path)
    path.write_text(f"hosts:\n  h: {{address: 10.0.0.1, profile: cpu, port: {'1' * 5000}}}\n")
    with pytest.raises(InventoryError, match=r"inv.yaml:2: cannot read the int '1+\.\.\.1+': Exceeds the limit"):
        inventory.load(path)


VALID_HOST = "hosts:\n  h: {address: 10.0.0.1, profile: cpu, vars: {extra_args: VALUE}}\n"


def nested(depth: int) -> str:
    return "[" * depth + "--x" + "]" * depth


def test_nesting_is_bounded_through_aliases_too(tmp_path: Path) -> None:
    """A host's settings are 4 levels down: 27 lists below them with the string inside (32 levels)
    are read (and refused as settings); 28 are past the bound of 32, whether written out or reached
    through an alias, here of 20 lists placed 8 deep."""
    path = tmp_path / "inv.yaml"
    for value in (nested(27), "[" * 7 + "*deep" + "]" * 7):
        path.write_text("x: &deep " + nested(20) + "\n" + VALID_HOST.replace("VALUE", value))
        with pytest.raises(InventoryError, match="inv.yaml:1: key 'x': unknown key"):
            inventory.load(path)
    path.write_text(VALID_HOST.replace("VALUE", nested(27)))
    with pytest.raises(InventoryError, match="key 'extra_args': expected a list of strings, got"):
        inventory.load(path)
    path.write_text(VALID_HOST.replace("VALUE", nested(28)))
    with pytest.raises(InventoryError, match=r"inv.yaml:2: nested more than 32 levels deep$"):
        inventory.load(path)
    path.write_text("x: &deep " + nested(20) + "\n" + VALID_HOST.replace("VALUE", "[" * 8 + "*deep" + "]" * 8))
    with pytest.raises(InventoryError, match=r"inv.yaml:3: alias \*deep nests values more than 32 levels"):
        inventory.load(path)


def test_a_file_larger_than_the_bound_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  h: {address: 10.0.0.1, profile: cpu}\n" + "#" * inventory.MAX_INVENTORY_BYTES)
    with pytest.raises(InventoryError, match=r"inv.yaml: the inventory is larger than 512 KiB$"):
        inventory.load(path)
    (tmp_path / "more.yaml").write_text("# a second file: the bound holds for the inventory, not each file\n")
    path.write_text("hosts:\n  h: {address: 10.0.0.1, profile: cpu}\n" + "#" * (inventory.MAX_INVENTORY_BYTES - 100))
    with pytest.raises(InventoryError, match=r"more.yaml: the inventory is larger than 512 KiB$"):
        inventory.load(tmp_path)


def test_a_thousand_hosts_with_their_own_settings_stay_within_the_bounds(tmp_path: Path) -> None:
    """The bounds are for hostile files: a large real inventory is far from them."""
    lines = ["hosts:"]
    for i in range(1000):
        lines += [f"  host-{i}:", f"    address: 10.0.{i // 256}.{i % 256}", "    profile: rtx5090",
                  "    vars:", "      model: Qwen/Qwen3-30B-A3B-Instruct-2507-AWQ", "      tensor_parallel_size: 2",
                  "      environment: {VLLM_LOGGING_LEVEL: INFO, NCCL_P2P_DISABLE: '1'}",
                  "      extra_args: [--enable-chunked-prefill, --max-num-seqs, '64']"]
    path = tmp_path / "inv.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert len(inventory.load(path).hosts) == 1000


@pytest.mark.parametrize("text", ["", "# hosts come later\n", "---\n...\n", "~\n", "hosts:\n", "hosts: {}\n",
                                  "ssh: {connect_timeout: 5}\n"],
                         ids=["empty", "comments", "null-document", "tilde", "hosts-null", "hosts-empty", "ssh-only"])
def test_an_inventory_without_hosts_says_so_naming_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError) as caught:
        inventory.load(path)
    assert str(caught.value) == f"{path}: the inventory is empty (no hosts)"


def test_a_directory_of_empty_files_is_an_empty_inventory(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("")
    (tmp_path / "b.yml").write_text("# nothing yet\n")
    with pytest.raises(InventoryError) as caught:
        inventory.load(tmp_path)
    assert str(caught.value) == f"{tmp_path}: the inventory is empty (no hosts)"


@pytest.mark.parametrize("task", [["check", "--all"], ["facts", "--all"], ["inventory"]], ids=" ".join)
def test_cli_says_the_inventory_is_empty_and_exits_2_even_with_all(tmp_path: Path, task: list[str]) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# hosts come later\n")
    done = run_invoke(*task, "--inventory", str(empty))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: {empty}: the inventory is empty (no hosts)" and done.stdout == ""


def test_a_task_for_this_machine_alone_reads_an_inventory_without_hosts(tmp_path: Path) -> None:
    """`--host local` needs no entry: an inventory that names no host (its ssh settings only, say) is read,
    and `local` is this machine; every other selection still says the inventory is empty."""
    from provision import taskargs

    path = tmp_path / "inv.yaml"
    path.write_text("ssh: {connect_timeout: 5}\n")
    inv = taskargs.load_inventory(str(path), local_only=True)
    assert inv.hosts == {} and inv.host("local").connection == "local" and inv.ssh.connect_timeout == 5
    with pytest.raises(InventoryError, match="the inventory is empty"):
        taskargs.load_inventory(str(path))
    done = run_invoke("facts", "--host", "local", "--json", "--inventory", str(path))
    assert done.returncode == 0, done.stderr
    assert "local" in json.loads(done.stdout)["hosts"]


def test_the_typed_settings_hold_exactly_the_rows_of_the_settings_table() -> None:
    """A setting added to VAR_SPECS without its typed field (or the other way round) fails here; a
    mistyped name in the code fails mypy, since settings are read as attributes."""
    fields = [f.name for f in dataclasses.fields(inventory.Settings) if f.name != "origin"]
    assert fields == list(inventory.VAR_SPECS)
    defaults = inventory.Settings.of({})
    assert defaults.values == {name: (tuple(spec.default) if isinstance(spec.default, tuple) else spec.default)
                               for name, spec in inventory.VAR_SPECS.items()}


# ---------------------------------------------------------------------------------------------
# Settings that would hand the system to the service user, or undo what the tool sets

HOSTILE_PATHS = ["/", "/etc", "/usr", "/var/lib/vllm/models/../../../../etc", "/var/lib", "/home/alice",
                 "/etc/vllm-models", "/lib64/x", "//usr", "/tmp/models"]
SERVICE_DIRECTORIES = ["model_dir", "hf_home", "venv_dir"]


def _host_vars_inventory(tmp_path: Path, values: dict[str, object]) -> Path:
    import yaml

    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"h1": {"address": "10.0.0.1", "profile": "cpu", "vars": values}}}))
    return path


@pytest.mark.parametrize("setting", SERVICE_DIRECTORIES)
@pytest.mark.parametrize("path", HOSTILE_PATHS)
def test_a_service_directory_may_not_be_a_system_directory(setting: str, path: str, tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=rf"key '{setting}': .*(system|top-level|'\.\.'|user directory)"):
        inventory.parse_overrides([f"{setting}={path}"])
    with pytest.raises(InventoryError, match=rf"host 'h1': key '{setting}'"):
        inventory.load(_host_vars_inventory(tmp_path, {setting: path}))


@pytest.mark.parametrize("given,normal", [("/srv/models/", "/srv/models"), ("/var/lib//vllm/./hf", "/var/lib/vllm/hf"),
                                          ("/opt/vllm/venv", "/opt/vllm/venv")])
def test_a_service_directory_is_normalised(given: str, normal: str) -> None:
    assert inventory.parse_overrides([f"model_dir={given}"]) == {"model_dir": normal}


def test_server_program_and_a_model_path_refuse_dot_dot() -> None:
    assert inventory.parse_overrides(["server_program=/usr/bin//llama-server"]) == {
        "server_program": "/usr/bin/llama-server"}  # a program may live in /usr: it is run, not owned
    for setting in ("server_program", "model"):
        with pytest.raises(InventoryError, match=rf"key '{setting}': .*'\.\.'"):
            inventory.parse_overrides([f"{setting}=/opt/models/../../etc/shadow"])


@pytest.mark.parametrize("model", ["../../etc", "org/team/name", "-org/name", "org/name.git", "a--b", "a..b",
                                   "org/" + "x" * 97, "naïve/model", "org/name/"])
def test_model_is_a_hub_repository_id_or_an_absolute_path(model: str) -> None:
    with pytest.raises(InventoryError, match="key 'model': .* is not a hub repository id"):
        inventory.parse_overrides([f"model={model}"])


@pytest.mark.parametrize("model", ["gpt2", "lab/tiny-llama", "Qwen/Qwen2.5-0.5B-Instruct", "org/v1.5_x", "/srv/m"])
def test_a_good_model_id_passes(model: str) -> None:
    assert inventory.parse_overrides([f"model={model}"]) == {"model": model}


# Every flag each engine's server command sets from a setting, by the engines' own documentation (not
# read from provision/engines: the list is what the servers parse), with the setting to use instead.
KEY = "the secrets file's api_key"
OWNED = [
    # vLLM: vllm/entrypoints/launchers/cli_args.py (FrontendArgs), vllm/engine/arg_utils.py
    *(("vllm", flag, setting) for flag, setting in (
        ("--host", "bind_host"), ("--port", "port"), ("--uds", "bind_host and port"), ("--model", "model"),
        ("--served-model-name", "served_model_name"), ("--api-key", KEY))),
    # llama.cpp's llama-server: tools/server/README.md
    *(("llamacpp", flag, setting) for flag, setting in (
        ("--host", "bind_host"), ("--port", "port"), ("-m", "model"), ("--model", "model"), ("-mu", "model"),
        ("--model-url", "model"), ("-hf", "model"), ("-hfr", "model"), ("--hf-repo", "model"), ("-hff", "model"),
        ("--hf-file", "model"), ("-dr", "model"), ("--docker-repo", "model"), ("--models-dir", "model"),
        ("-a", "served_model_name"), ("--alias", "served_model_name"), ("--api-key", KEY),
        ("--api-key-file", KEY),
        # its slots and their context (common/arg.cpp at b11434): rendered together, each slot max_model_len
        ("-np", "concurrent_sequences"), ("--parallel", "concurrent_sequences"),
        ("-kvu", "concurrent_sequences"), ("--kv-unified", "concurrent_sequences"),
        ("-no-kvu", "concurrent_sequences"), ("--no-kv-unified", "concurrent_sequences"),
        ("-c", "max_model_len"), ("--ctx-size", "max_model_len"))),
    # TensorRT-LLM's trtllm-serve: commands/trtllm-serve (the model is its positional argument)
    *(("trtllm", flag, setting) for flag, setting in (
        ("--host", "bind_host"), ("--port", "port"), ("--served_model_name", "served_model_name"))),
]


def _spellings(flag: str) -> list[str]:
    """The ways a server reads one flag: as given, with "=", and (long flags) with "_" for "-"."""
    ways = [flag, f"{flag}=0.0.0.0"]
    if flag.startswith("--") and ("-" in flag[2:] or "_" in flag[2:]):
        ways.append("--" + flag[2:].translate(str.maketrans("-_", "_-")))
    return ways


def _ids(case: tuple[str, str, str]) -> str:
    return f"{case[0]}:{case[1]}"


@pytest.mark.parametrize("case", OWNED, ids=_ids)
def test_a_flag_the_tool_sets_is_refused_in_server_flags_and_extra_args(case: tuple[str, str, str],
                                                                       tmp_path: Path) -> None:
    _engine, flag, setting = case
    for spelling in _spellings(flag):
        key, _, value = spelling.partition("=")
        overrides = [f"server_flags={{{key}: {value or '0.0.0.0'}}}", f"extra_args=[{spelling}, '0.0.0.0']"]
        for override in overrides:
            name = override.split("=", 1)[0]
            with pytest.raises(InventoryError) as caught:
                inventory.parse_overrides([override])
            assert f"key '{name}'" in str(caught.value) and f"set {setting} instead" in str(caught.value)
        for layer in ({"server_flags": {key: "0.0.0.0"}}, {"extra_args": [spelling, "0.0.0.0"]}):
            with pytest.raises(InventoryError, match=f"host 'h1': key '{next(iter(layer))}': .*set {setting}"):
                inventory.load(_host_vars_inventory(tmp_path, layer))


# Every flag of every engine that carries a credential (the catalog's credential_flags, and the API key's
# own flags, owned_flags' KEY): (engine, flag, what the refusal names as the safe place).
CREDENTIALS = [(engine.name, flag, "the secrets file's hf_token" if "hf_token" in safe else "no setting")
               for engine in catalog.ENGINES.values() for flag, safe in engine.credential_flags.items()] + \
              [(engine.name, flag, "set the secrets file's api_key instead")
               for engine in catalog.ENGINES.values() for flag, setting in engine.owned_flags.items()
               if setting == catalog.KEY]
TOKEN = "hf_0123456789abcdefSECRET"


@pytest.mark.parametrize("case", CREDENTIALS, ids=_ids)
def test_a_flag_that_carries_a_credential_is_refused_wherever_flags_are_given(case: tuple[str, str, str],
                                                                             tmp_path: Path) -> None:
    """server_flags, extra_args (--flag VALUE and --flag=VALUE), --set and a host's vars: refused, naming
    where the credential goes instead; the value is never in the refusal."""
    _engine, flag, safe = case
    spellings = [flag] + (["--" + flag[2:].replace("-", "_")] if flag.startswith("--") and "-" in flag[2:] else [])
    for spelling in spellings:
        for override in (f"server_flags={{{spelling}: {TOKEN}}}", f"extra_args=[{spelling}, {TOKEN}]",
                         f"extra_args=['{spelling}={TOKEN}']"):
            with pytest.raises(InventoryError) as caught:
                inventory.parse_overrides([override])
            said = str(caught.value)
            assert f"key '{override.split('=', 1)[0]}'" in said and safe in said and TOKEN not in said, said
        for layer in ({"server_flags": {spelling: TOKEN}}, {"extra_args": [spelling, TOKEN]}):
            with pytest.raises(InventoryError, match=f"host 'h1': key '{next(iter(layer))}': .*{re.escape(safe)}"):
                inventory.load(_host_vars_inventory(tmp_path, layer))


def test_a_flag_that_only_begins_like_a_credential_flag_passes() -> None:
    """--ssl-keyfile (a path, vLLM's and SGLang's own flag) is not --ssl-keyfile-password cut short."""
    assert inventory.parse_overrides(["extra_args=[--ssl-keyfile, /etc/ssl/key.pem]"]) == {
        "extra_args": ("--ssl-keyfile", "/etc/ssl/key.pem")}
    with pytest.raises(InventoryError, match="SGLang's --ssl-keyfile-password"):
        inventory.parse_overrides(["extra_args=[--ssl-keyfile-pass, x]"])


def test_the_credential_flags_are_the_engines_own() -> None:
    """Each credential flag is one the engine's own parser has: vLLM's parser options (run by vLLM
    itself), llama-server's --help, SGLang's argument fields; trtllm-serve 1.2.0 has none."""
    vllm = json.loads((FIXTURES / "wheels" / "vllm-0.34.0.parser-options.json").read_text())["options"]
    llama = json.loads((FIXTURES / "engines" / "llama-server-b11434-help.json").read_text())["stdout"]
    fields = "".join(path.read_text() for path in
                     (FIXTURES / "wheels" / "sglang-0.5.23" / "sglang" / "srt" / "arg_groups" / "fields").glob("*.py"))
    trtllm = json.loads((FIXTURES / "engines" / "trtllm-serve-v1.2.0.json").read_text())
    assert set(catalog.ENGINES["vllm"].credential_flags) <= set(vllm)
    assert all(re.search(rf"(^|[ ,]){re.escape(flag)}[ ,]", llama, re.MULTILINE)
               for flag in catalog.ENGINES["llamacpp"].credential_flags)
    assert all(re.search(rf"^    {flag[2:].replace('-', '_')}: A\[", fields, re.MULTILINE)
               for flag in catalog.ENGINES["sglang"].credential_flags)
    assert catalog.ENGINES["trtllm"].credential_flags == {}
    assert not [name for name in json.dumps(trtllm["options"]).split('"') if re.search(r"token$|key$|password", name)]


@pytest.mark.parametrize("override", [
    "server_flags={--speculative-config: '" + json.dumps({"model": "a/b", "hf_token": TOKEN}) + "'}",
    "extra_args=[--speculative-config, '" + json.dumps({"model": "a/b", "hf_token": TOKEN}) + "']",
    "extra_args=['--hf-overrides=" + json.dumps({"x": {"api_key": TOKEN}}) + "']",
], ids=["server-flags", "extra-args", "extra-args-equals-nested"])
def test_a_credential_inside_a_flags_json_value_is_refused(override: str) -> None:
    with pytest.raises(InventoryError) as caught:
        inventory.parse_overrides([override])
    said = str(caught.value)
    assert "JSON value holds" in said and "the secrets file's hf_token" in said and TOKEN not in said, said
    # The same flag without a credential is the engine's to judge.
    assert inventory.parse_overrides(["extra_args=[--speculative-config, '{\"model\": \"a/b\"}']"])


@pytest.mark.parametrize("abbreviation", ["--hos", "--ho", "--po", "--served-mod", "--api-k", "--mod"])
def test_an_abbreviation_vllm_would_read_as_an_owned_flag_is_refused(abbreviation: str) -> None:
    with pytest.raises(InventoryError, match=r"vLLM reads it as --"):
        inventory.parse_overrides([f"extra_args=[{abbreviation}, x]"])


@pytest.mark.parametrize(("value", "said"), [
    ("0", "expected an integer from 1 to 256, got 0"), ("257", "expected an integer from 1 to 256, got 257"),
    ("-1", "expected an integer from 1 to 256, got -1"), ("'4'", r"expected an integer, got '4' \(str\)"),
    ("true", r"expected an integer, got True \(bool\)"), ("2.5", r"expected an integer, got 2\.5 \(float\)"),
], ids=["zero", "past-llama-max-seq", "auto", "text", "boolean", "fraction"])
def test_concurrent_sequences_is_a_count_of_slots_llama_cpp_can_hold(value: str, said: str) -> None:
    """1 to 256: llama-server refuses 0 slots (common/arg.cpp:2547-2555 at b11434) and more sequences
    than LLAMA_MAX_SEQ (src/llama-cparams.h:8); its -1, auto, is what the tool renders explicitly."""
    with pytest.raises(InventoryError, match=rf"command line: key 'concurrent_sequences': {said}"):
        inventory.parse_overrides([f"concurrent_sequences={value}"])
    assert inventory.parse_overrides(["concurrent_sequences=8"]) == {"concurrent_sequences": 8}
    assert inventory.VAR_SPECS["concurrent_sequences"].default is None  # the engine's own: llama.cpp's 4


def test_flags_the_tool_does_not_set_still_pass() -> None:
    assert inventory.parse_overrides(["server_flags={--max-num-seqs: 64, --enforce-eager: true}",
                                      "extra_args=[--hf-token-path, /x, -ngl, '10', --model-impl, vllm]"]) == {
        "server_flags": {"--max-num-seqs": 64, "--enforce-eager": True},
        "extra_args": ("--hf-token-path", "/x", "-ngl", "10", "--model-impl", "vllm")}


# ---------------------------------------------------------------------------------------------
# Endpoints' own settings

def test_an_endpoints_fields_default_to_its_settings_table() -> None:
    """A setting added to ENDPOINT_SPECS without its field (or with another default) fails here."""
    defaults = {f.name: f.default for f in dataclasses.fields(inventory.Endpoint)}
    assert {name: defaults[name] for name in inventory.ENDPOINT_SPECS} == {
        name: spec.default for name, spec in inventory.ENDPOINT_SPECS.items()}


def test_an_endpoints_settings_reach_the_router_plan(tmp_path: Path) -> None:
    from provision import endpoints
    from tests.test_rollback import ENDPOINT_INVENTORY

    (tmp_path / "hosts.yaml").write_text(ENDPOINT_INVENTORY.replace(
        "drain_timeout: 30", "drain_timeout: 30, max_body_mb: 0.5, request_timeout: 120, receive_timeout: 5, "
                             "routing: prefix-affinity"))
    plan = endpoints.named(inventory.load(tmp_path), "tiny")
    assert (plan.routing, plan.max_body_mb, plan.body_limit, plan.request_timeout, plan.receive_timeout) == (
        "prefix-affinity", 0.5, 512 * 1024, 120.0, 5.0)
    assert endpoints.buffer_size([plan]) == 512 * 1024 + endpoints.HEADER_ROOM
    (tmp_path / "hosts.yaml").write_text(ENDPOINT_INVENTORY)
    plan = endpoints.named(inventory.load(tmp_path), "tiny")
    assert (plan.routing, plan.max_body_mb, plan.request_timeout, plan.receive_timeout) == (
        "least-connections", 2.0, 900.0, 30.0)


def test_the_old_name_of_engine_spec_is_read_with_one_line_per_use_naming_the_new(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  a:\n    address: 10.0.0.1\n    profile: rtx5090\n    vars:\n      vllm_spec: vllm==0.34.0\n"
                    "  b:\n    address: 10.0.0.2\n    profile: rtx5090\n    vars:\n      vllm_spec: vllm==0.33.0\n")
    with caplog.at_level("WARNING", logger="provision.inventory"):
        inv = inventory.load(path)
    assert inv.hosts["a"].vars["engine_spec"] == "vllm==0.34.0" and "vllm_spec" not in inv.hosts["a"].vars
    assert [record.getMessage() for record in caplog.records] == [
        f"{path}:6 (host 'a'): vllm_spec is deprecated: write engine_spec (read as engine_spec this time)",
        f"{path}:11 (host 'b'): vllm_spec is deprecated: write engine_spec (read as engine_spec this time)"]
    assert inventory.parse_overrides(["vllm_spec=vllm==0.34.0"]) == {"engine_spec": "vllm==0.34.0"}
    with pytest.raises(InventoryError, match="vllm_spec is the old name of engine_spec, which is given too"):
        inventory.validate_vars({"vllm_spec": "vllm", "engine_spec": "vllm"}, source="x.yaml", entity=None)
