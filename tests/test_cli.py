"""The command line: the task list as Invoke shows it; the installed command's door (cluster tasks on this
machine with no inventory, a reader that goes away); the shared flags. The hints it prints:
tests/test_hints.py."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_each_task_s_summary_in_the_list_is_one_whole_sentence_on_its_row() -> None:
    """`invoke --list` shows each task's first docstring line (invoke.util.helpline), wrapped by
    Program.print_columns to the terminal's width (80 columns when its output is not a terminal, as
    here): each one a whole sentence, on its own row, not the start of one cut at the line's end."""
    from provision.cli import ns

    done = subprocess.run([sys.executable, "-m", "invoke", "--list"], cwd=ROOT, capture_output=True, text=True,
                          check=True, timeout=60)
    heading, blank, *rows = done.stdout.splitlines()
    assert (heading, blank) == ("Subcommands:", "")
    rows = rows[:rows.index("")]
    summaries: dict[str, str] = {}
    wrapped: list[str] = []
    for row in rows:
        if row.startswith("  ") and not row[2].isspace():
            name, _, summary = row.strip().partition(" ")
            summaries[name] = summary.strip()
        else:  # a summary's next line: it did not fit its row
            wrapped.append(f"{list(summaries)[-1]}: ...{row.strip()}")
    assert set(summaries) == set(ns.task_names)
    assert not wrapped, "\n".join(wrapped)
    cut = [f"{name}: {summary}" for name, summary in summaries.items() if not re.search(r"[.!?][)`]?$", summary)]
    assert not cut, "\n".join(cut)


def test_status_of_this_machine_needs_no_inventory(tmp_path: Path) -> None:
    """`status --host local` is a cluster task's door to this machine: like the host tasks, it needs no
    inventory (a lab directory with nothing in it: a lab brought up by this checkout would be the default)."""
    command = shutil.which("provision")
    if command is None:
        pytest.fail("the `provision` console script is not installed (README's first command installs it)")
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROVISION_")}
    env["PROVISION_LAB_DIR"] = str(tmp_path / "no-lab")
    done = subprocess.run([command, "status", "--host", "local", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert "none found" not in done.stderr and done.returncode in (0, 1), done.stderr
    assert list(json.loads(done.stdout)["hosts"]) == ["local"]


@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "unbuffered"])
def test_a_reader_that_goes_away_ends_the_command_quietly(unbuffered: str) -> None:
    """`provision check -h | head -3`: the pipe is closed before the help is written; no traceback.
    Both ways stdout can be: block buffered, as piped by default (the help is still in the buffer when
    the task ends), and unbuffered (PYTHONUNBUFFERED, which a user's or a CI's environment may
    set: every print meets the closed pipe)."""
    command = shutil.which("provision")
    if command is None:
        pytest.fail("the `provision` console script is not installed (README's first command installs it)")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    running = subprocess.Popen([command, "check", "-h"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    assert running.stdout is not None and running.stderr is not None
    running.stdout.close()  # before the interpreter has even started: every write meets a closed pipe
    with running.stderr:
        error = running.stderr.read()
    running.wait(timeout=120)
    assert "Traceback" not in error and "BrokenPipeError" not in error, error
    assert running.returncode == 1


def test_a_host_task_declares_the_shared_flags_and_hands_them_over_parsed() -> None:
    """host_task gives Invoke one signature of the shared flags and the task's own, each with its help,
    and the body one HostFlags (repeated flags as tuples, an own flag's help where the task gives it)."""
    from invoke.context import Context

    from provision.taskargs import COMMON_HELP, HostFlags, host_task

    seen: dict[str, object] = {}

    @host_task("probe", "host", "json", "set", "wait", "verbose", help={"own": "an own flag"})
    def probe(c: Context, flags: HostFlags, own: int = 3) -> None:
        seen.update(flags=flags, own=own)

    arguments = {argument.names[0]: argument for argument in probe.get_arguments()}
    assert set(arguments) == {"host", "json", "set", "wait", "verbose", "own"}
    assert arguments["host"].help == COMMON_HELP["host"] and arguments["own"].help == "an own flag"
    assert arguments["own"].default == 3 and arguments["set"].kind is list
    probe(Context(), host=["a", "b"], json_=True, set_=None, wait=0, verbose=False, own=4)
    assert seen == {"flags": HostFlags(host=("a", "b"), json=True), "own": 4}


# Invoke's core options that only shape Invoke's own run(): the tool runs no command through it.
UNHONOURED = ("--dry", "--echo", "--warn-only", "--pty", "--hide=both", "--prompt-for-sudo-password",
              "--command-timeout=5", "--config=x.yaml")


def _installed() -> str:
    command = shutil.which("provision")
    if command is None:
        pytest.fail("the `provision` console script is not installed (README's first command installs it)")
    return command


def test_the_installed_help_lists_no_core_option_the_tool_does_not_honour() -> None:
    """`provision -h` lists Invoke's core options: those of its own run() (--dry, --echo, ...) would
    do nothing here, so they are not offered, and the help says where the dry runs are."""
    done = subprocess.run([_installed(), "-h"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    offered = set(re.findall(r"--[a-z-]+", done.stdout.split("Subcommands:")[0]))
    assert offered.isdisjoint({option.split("=")[0] for option in UNHONOURED}), offered
    assert {"--list", "--help", "--version"} <= offered
    assert "Dry runs: `provision plan --all` shows what a deploy would change" in done.stdout


@pytest.mark.parametrize("option", UNHONOURED)
@pytest.mark.parametrize("door", ["provision", "invoke"])
def test_a_core_option_of_invokes_run_is_refused_before_the_task_runs(option: str, door: str,
                                                                      tmp_path: Path) -> None:
    """`provision --dry init --output x.yaml` wrote the file: a user who asks for a dry run gets a
    refusal (exit 2, a usage error) naming the tool's own dry runs, and nothing is written. The same
    from the checkout's `invoke`, whose tasks.py hands the command line to the tool's program before
    Invoke's own would ask for the sudo password (an answer is on stdin here all the same)."""
    written = tmp_path / "starter.yaml"
    argv = ([_installed()] if door == "provision" else [sys.executable, "-m", "invoke"])
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PROVISION_", "INVOKE_"))}
    env["PROVISION_LAB_DIR"] = str(tmp_path / "no-lab")
    done = subprocess.run([*argv, option, "init", "--host", "local", "--output", str(written)],
                          cwd=tmp_path if door == "provision" else ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False, input="not-a-password\n")
    name = option.split("=")[0]
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert f"error: {name} is Invoke's core option, not this tool's" in done.stderr
    assert f"`{door} plan --all` (what a deploy would change)" in done.stderr
    assert not written.exists()


def test_the_installed_command_refuses_a_token_in_set_and_in_an_inventorys_server_flags(tmp_path: Path) -> None:
    """`provision check --set 'server_flags=...'` and an inventory whose server_flags give --hf-token:
    a usage error (exit 2) naming the secrets file's hf_token; the token is printed nowhere."""
    token = "hf_cli0123456789SECRET"
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROVISION_")}
    env["PROVISION_LAB_DIR"] = str(tmp_path / "no-lab")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  local:\n    connection: local\n    profile: cpu\n"
                     f"    vars: {{model: org/tiny, server_flags: {{--hf-token: {token}}}}}\n")
    for args in (["--set", "model=org/tiny", "--set", f"server_flags={{--hf-token: {token}}}"],
                 ["--inventory", str(hosts)]):
        done = subprocess.run([_installed(), "check", "--host", "local", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert "--hf-token carries a credential" in done.stderr
        assert "give it as the secrets file's hf_token" in done.stderr
        assert token not in done.stdout + done.stderr


# Tasks whose NAME (or URL) comes first: Invoke hands them -h as that value, and they print their help
# by running a second program over the same tasks (recipe_tasks._given).
NAME_FIRST = ("recipe.show", "recipe.apply", "recipe.import", "recipe.export", "registry.add", "registry.remove")


@pytest.mark.parametrize("name", NAME_FIRST)
def test_a_task_s_own_help_describes_each_of_its_options(name: str, tmp_path: Path) -> None:
    """`provision recipe.show -h` listed the options bare: Invoke takes each flag's help out of the task
    as it builds its parser, and the second program found none left. Each option has its words, the
    same as `provision --help recipe.show` prints."""
    done = subprocess.run([_installed(), name, "-h"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    options = done.stdout.split("Options:\n")[1].splitlines()
    bare = [row for row in options if row.startswith("  --") and len(row.split()) == 1]
    assert options and not bare, done.stdout
    whole = subprocess.run([_installed(), "--help", name], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, check=True)
    assert done.stdout == whole.stdout


def _no_inventory_env(tmp_path: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PROVISION_", "INVOKE_"))}
    env["PROVISION_LAB_DIR"] = str(tmp_path / "no-lab")
    return env


@pytest.mark.parametrize(("argv", "alone"), [
    (["logs", "--host", "local"], False), (["bench", "--host", "local"], False),
    (["recipe.show", "lab-cpu-tiny-llama", "--host", "local"], False), (["check", "--all"], True),
], ids=["logs", "bench", "recipe.show", "check"])
def test_no_inventory_says_local_needs_none_only_where_it_does(argv: list[str], alone: bool,
                                                                tmp_path: Path) -> None:
    """"`--host local` alone needs no inventory" was printed by logs, bench and recipe.show, which read
    their host's settings from one and refuse --host local without it."""
    done = subprocess.run([_installed(), *argv], cwd=tmp_path, env=_no_inventory_env(tmp_path), capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2 and "error: inventory: none found" in done.stderr, done.stderr
    assert ("`--host local` alone needs no inventory" in done.stderr) == alone, done.stderr


def test_an_inventory_named_by_the_environment_and_absent_is_the_headline(tmp_path: Path) -> None:
    """With $PROVISION_INVENTORY=nope.yaml the headline said "none found" while the list under it said
    ./inventory was found: the headline names the missing file, and the found one says it was not read."""
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "hosts.yaml").write_text("hosts: {}\n")
    env = {**_no_inventory_env(tmp_path), "PROVISION_INVENTORY": "nope.yaml"}
    done = subprocess.run([_installed(), "check", "--all"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    first, *rest = done.stderr.splitlines()
    assert first.startswith("error: inventory: $PROVISION_INVENTORY names nope.yaml, which is not there"), first
    assert "none found" not in done.stderr
    assert f"{tmp_path / 'inventory'}: found, not read: nope.yaml comes first" in "\n".join(rest), done.stderr


TWO_CLUSTERS = """hosts:
  a: {address: 127.0.0.1, port: 1, user: nobody, profile: cpu, vars: {model: org/tiny}}
  b: {address: 127.0.0.1, port: 1, user: nobody, profile: cpu, vars: {model: org/tiny}}
clusters:
  ca: {hosts: [a]}
  cb: {hosts: [b]}
"""


def test_cluster_repeats_as_host_does(tmp_path: Path) -> None:
    """`status --cluster ca --cluster cb` answered "No idea what 'cb' is!" where --host repeats: both
    clusters' hosts are asked (nothing listens on their port here: each is unreachable, exit 1)."""
    (tmp_path / "hosts.yaml").write_text(TWO_CLUSTERS)
    done = subprocess.run([_installed(), "status", "--inventory", "hosts.yaml", "--cluster", "ca", "--cluster", "cb",
                           "--json", "--timeout", "2"], cwd=tmp_path, env=_no_inventory_env(tmp_path),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, (done.stdout, done.stderr)
    answer = json.loads(done.stdout)
    assert sorted(answer["hosts"]) == ["a", "b"]
    assert all(not host["reachable"] for host in answer["hosts"].values())


def test_a_task_of_one_cluster_given_two_says_so_as_a_usage_error(tmp_path: Path) -> None:
    """bench measures one server: two clusters are a usage error (exit 2) that says what was given."""
    (tmp_path / "hosts.yaml").write_text(TWO_CLUSTERS)
    done = subprocess.run([_installed(), "bench", "--inventory", "hosts.yaml", "--cluster", "ca", "--cluster", "cb"],
                          cwd=tmp_path, env=_no_inventory_env(tmp_path), capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip() == "error: bench takes one cluster; --cluster was given 2 times (ca, cb)"


@pytest.mark.parametrize(("argv", "said"), [
    (["chek", "--all"], "error: No idea what 'chek' is! Did you mean check?"),
    (["recipe.shwo", "x"], "error: No idea what 'recipe.shwo' is! Did you mean recipe.show"),
    (["check", "--hots", "a"], "error: No idea what '--hots' is! Did you mean --host?"),
    (["check", "--inventory", "hosts.yaml", "--host", "aa"],
     "error: hosts.yaml: unknown host 'aa': did you mean a? (known: a, b, or 'local')"),
    (["check", "--inventory", "hosts.yaml", "--cluster", "cb2"],
     "error: hosts.yaml: unknown cluster 'cb2': did you mean cb? (known: ca, cb)"),
    (["check", "--profile"], "error: --profile needs a value"),
    (["bench", "--host", "a", "--host", "b"], "error: bench takes one --host: it was given twice ('b' the second)"),
    (["logs", "--host", "a", "--lines", "5", "--host", "b"],
     "error: logs takes one --host: it was given twice ('b' the second)"),
    (["--help", "chek"], "error: No idea what 'chek' is! Did you mean check?"),
    (["--list", "recpe"], "error: Sub-collection 'recpe' not found! Did you mean recipe? (namespaces: lab, recipe,"),
    (["--list", "--list-format", "yaml"], "error: --list-format is one of flat, nested, json, not 'yaml'"),
], ids=["task", "dotted-task", "flag", "host", "cluster", "flag-without-value", "bench-two-hosts", "logs-two-hosts",
        "help-of-a-task", "list-namespace", "list-format"])
def test_a_usage_error_exits_2_and_a_mistyped_name_gets_the_nearest(argv: list[str], said: str,
                                                                    tmp_path: Path) -> None:
    """Invoke's own parser errors exited 1, the status of a host that failed, and named nothing near a
    mistyped word: every usage error exits 2, and a task, flag, host or cluster mistyped gets the names
    closest to it."""
    (tmp_path / "hosts.yaml").write_text(TWO_CLUSTERS)
    done = subprocess.run([_installed(), *argv], cwd=tmp_path, env=_no_inventory_env(tmp_path), capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(said), done.stderr


def _checkout_invoke() -> str:
    """Invoke's own console script, installed beside the interpreter running the tests."""
    command = shutil.which("invoke", path=str(Path(sys.executable).parent))
    if command is None:
        pytest.fail(f"Invoke's `invoke` script is not beside {sys.executable} (Invoke installs it)")
    return command


@pytest.mark.parametrize(("argv", "said"), [
    (["check", "--bogus"], "error: No idea what '--bogus' is!"),
    (["nosuchtask"], "error: No idea what 'nosuchtask' is!\n"),
    (["chek", "--all"], "error: No idea what 'chek' is! Did you mean check?"),
    (["check", "--hots", "a"], "error: No idea what '--hots' is! Did you mean --host?"),
    (["-r", str(ROOT), "--no-dedupe", "chek"], "error: No idea what 'chek' is! Did you mean check?"),
], ids=["flag", "task", "task-near", "flag-near", "search-root"])
def test_a_usage_error_exits_2_from_the_checkout_s_invoke_too(argv: list[str], said: str, tmp_path: Path) -> None:
    """Invoke's own program exited 1 on its parser's errors, where `provision` exits 2: the root tasks.py
    hands the command line to the tool's program, so `invoke` in a checkout says and exits the same
    (the core options with which Invoke found the tasks, -r and --no-dedupe here, still accepted)."""
    done = subprocess.run([_checkout_invoke(), *argv], cwd=tmp_path if "-r" in argv else ROOT,
                          env=_no_inventory_env(tmp_path),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(said), done.stderr


def test_the_checkout_s_invoke_runs_a_task_once_and_a_failed_host_exits_1(tmp_path: Path) -> None:
    """Past the hand-over, a task runs once (Invoke's own program does not run it again: one JSON
    document, exit 0), and a host that fails still exits 1, not a usage error's 2."""
    (tmp_path / "hosts.yaml").write_text(TWO_CLUSTERS)
    inventory = str(tmp_path / "hosts.yaml")
    listed = subprocess.run([_checkout_invoke(), "inventory", "--inventory", inventory, "--json"], cwd=ROOT,
                            env=_no_inventory_env(tmp_path), capture_output=True, text=True, timeout=120,
                            check=False)
    assert listed.returncode == 0, listed.stderr
    assert sorted(json.loads(listed.stdout)["hosts"]) == ["a", "b"]
    failed = subprocess.run([_checkout_invoke(), "status", "--inventory", inventory, "--cluster", "ca", "--json",
                             "--timeout", "2"], cwd=ROOT, env=_no_inventory_env(tmp_path), capture_output=True,
                            text=True, timeout=120, check=False)
    assert failed.returncode == 1, (failed.stdout, failed.stderr)
    assert not json.loads(failed.stdout)["hosts"]["a"]["reachable"]


def test_bench_against_a_server_that_does_not_answer_says_what_was_asked_and_what_answered(tmp_path: Path) -> None:
    """`bench` where nothing listens printed "3 x URLError: <urlopen error [Errno 111] Connection
    refused>": it names the request and that nothing answered it."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "hosts.yaml").write_text(
        f"hosts:\n  local: {{connection: local, profile: cpu, vars: {{model: org/tiny, port: {port}}}}}\n")
    done = subprocess.run([_installed(), "bench", "--inventory", "hosts.yaml", "--host", "local", "--count", "2",
                           "--concurrency", "1"], cwd=tmp_path, env=_no_inventory_env(tmp_path), capture_output=True,
                          text=True, timeout=120, check=False)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, said
    assert (f"2 x asked POST http://127.0.0.1:{port}/v1/completions: nothing answered: connection refused "
            "(no server listens on that port: not deployed, or stopped)") in said, said
    assert "URLError" not in said
