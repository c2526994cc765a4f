"""Weights and wheels into 1, 2, 4 and 8 lab hosts over rate-limited links: every host from the hub,
today's star (one host from the hub, then every other from it) and the relay (a chain passing bytes on
as they arrive), all in one run, timed against one host's time.

    python3 benchmarks/transfer.py                        # 1, 2, 4, 8 hosts; 300 MB model in 4 files; 50 MB/s links
    python3 benchmarks/transfer.py --counts 1,8 --size-mb 300 --rate 400mbit --repeat 3

As root, on the machine that runs the lab (see docs/lab.md). The lab's links are limited
with tc token buckets (`invoke lab.shape`): each host's link both ways at --rate, and this machine's
side of the lab bridge (the hub's and the controller's uplink) at --hub-rate. The model is made here
(a safetensors file of random bytes), published on the lab hub, and fetched with `invoke weights`;
the wheels are a small real set (--wheels) installed with `invoke venv`. Hosts are reset before each
run (their model directory, wheelhouse and venv removed).

Figures per run: wall time of the command, bytes the hub sent (its own counters), bytes the
controller sent (wheels), bytes each host received and from whom (the tool's report), and the
controller's CPU seconds. Writes results/transfer.json and results/transfer.md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from run import busy_seconds  # benchmarks/run.py: the machine's busy CPU seconds

from provision import lab
from provision.lab import hub

WORK = HERE / "work" / "transfer"
RESULTS = HERE / "results"
MODEL_DIR = "/srv/relay-bench"
REPO = "bench/relay-model"
STRATEGIES = ("hub", "star", "relay")
WHEELS = "idna==3.10 urllib3==2.2.3 certifi==2024.8.30 charset-normalizer==3.4.0 requests==2.32.3 numpy==2.1.3"
VENV = "/opt/relay-bench/venv"


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def hub_call(the_lab: lab.Lab, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{the_lab.hub_url}{path}", data=data, method="POST" if data else "GET")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def publish_model(the_lab: lab.Lab, size: int, shards: int) -> str:
    """`size` random bytes in `shards` safetensors files, named as real sharded checkpoints are."""
    import numpy as np
    from safetensors.numpy import save_file

    random = np.random.default_rng(11)
    with tempfile.TemporaryDirectory() as scratch:
        files = Path(scratch) / "files"
        files.mkdir()
        for number in range(1, shards + 1):
            tensor = random.integers(0, 255, size // shards, dtype=np.uint8)
            save_file({f"weights.{number}": tensor}, str(files / f"model-{number:05d}-of-{shards:05d}.safetensors"))
        (files / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
        return hub.publish(the_lab.hub_root, REPO, files)


def write_inventory(the_lab: lab.Lab, names: list[str], wheels: str) -> Path:
    document = yaml.safe_load(the_lab.inventory.read_text())
    document["clusters"] = {f"bench-{len(names)}": {"hosts": names, "vars": {
        "model": REPO, "model_dir": MODEL_DIR, "cluster_network": str(the_lab.network), "engine_spec": wheels,
        "venv_dir": VENV}}}
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"inventory-{len(names)}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def ssh(the_lab: lab.Lab, name: str, argv: list[str]) -> None:
    address = the_lab.state()["hosts"][name]["address"]
    subprocess.run(["ssh", "-i", str(the_lab.key), "-o", f"UserKnownHostsFile={the_lab.known_hosts}",
                    "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{address}", *argv],
                   check=True, capture_output=True, timeout=120)


def reset(the_lab: lab.Lab, names: list[str]) -> None:
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        list(pool.map(lambda name: ssh(the_lab, name, ["rm", "-rf", MODEL_DIR, "/var/cache/provision/wheels",
                                                       os.path.dirname(VENV)]), names))
    hub_call(the_lab, "/_lab/reset", {})


def invoke(task: str, inventory: Path, cluster: str, strategy: str) -> tuple[float, float, dict[str, Any]]:
    """(wall seconds, the controller's CPU seconds, the JSON report) of one task run; the machine's busy
    CPU seconds during it go into the report as `machine_cpu_s`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = busy_seconds()
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(ROOT), task, "--inventory",
                           str(inventory), "--cluster", cluster, "--set", f"transfer={strategy}", "--json"],
                          capture_output=True, text=True, timeout=3600, check=False)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{task} {cluster} {strategy}: exit {done.returncode}: {done.stdout[-1500:]} "
                           f"{done.stderr[-1500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    report: dict[str, Any] = json.loads(done.stdout)
    report["machine_cpu_s"] = round(busy_seconds() - busy, 2)
    return wall, cpu, report


def hub_bytes(the_lab: lab.Lab) -> int:
    clients = hub_call(the_lab, "/_lab/stats")["client_files"]
    return sum(count for client, files in clients.items() if client != the_lab.gateway()
               for key, count in files.items() if key.startswith(REPO + "/"))


def one_run(the_lab: lab.Lab, names: list[str], strategy: str, wheels: str) -> dict[str, Any]:
    inventory = write_inventory(the_lab, names, wheels)
    cluster = f"bench-{len(names)}"
    reset(the_lab, names)
    weights_s, weights_cpu, report = invoke("weights", inventory, cluster, strategy)
    received = {name: report["hosts"][name]["fetched"]["by_source"] for name in names}
    hub_sent = hub_bytes(the_lab)
    venv_s, venv_cpu, venv_report = invoke("venv", inventory, cluster, strategy)
    return {"hosts": len(names), "strategy": strategy, "weights_s": round(weights_s, 2),
            "weights_cpu_s": round(weights_cpu, 2), "weights_machine_cpu_s": report["machine_cpu_s"],
            "hub_bytes": hub_sent, "received": received,
            "rerouted": {name: report["hosts"][name]["fetched"]["rerouted"] for name in names
                         if report["hosts"][name]["fetched"]["rerouted"]},
            "venv_s": round(venv_s, 2), "venv_cpu_s": round(venv_cpu, 2),
            "controller_bytes": venv_report["bytes_from_controller"], "wheels": venv_report["wheels"]}


def controller_cpu(the_lab: lab.Lab, counts: list[int], wheels: str) -> dict[str, Any]:
    """The controller's CPU for an unchanged cluster (`invoke plan`) at each host count: what a host
    more costs it, and what that means for 1,000 hosts."""
    found = {}
    for count in counts:
        names = [f"bench-{n:02d}" for n in range(1, count + 1)]
        inventory = write_inventory(the_lab, names, wheels)
        samples = []
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(ROOT), "plan", "--inventory",
                            str(inventory), "--cluster", f"bench-{count}", "--json"], capture_output=True,
                           timeout=600, check=False)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            samples.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        found[count] = statistics.median(samples)
    low, high = min(counts), max(counts)
    per_host = (found[high] - found[low]) / (high - low) if high > low else 0.0
    return {"cpu_s": found, "per_extra_host_ms": round(per_host * 1000, 1),
            "thousand_hosts_cpu_s": round(found[low] + per_host * (1000 - low), 1)}


def write_results(runs: list[dict[str, Any]], cpu: dict[str, Any], args: argparse.Namespace) -> None:
    RESULTS.mkdir(exist_ok=True)
    size = args.size_mb * 10**6
    (RESULTS / "transfer.json").write_text(json.dumps({"size_bytes": size, "rate": args.rate, "hub_rate": args.hub_rate,
                                                       "runs": runs, "controller_cpu": cpu}, indent=1))
    base = statistics.median(r["weights_s"] for r in runs if r["hosts"] == 1 and r["strategy"] == "relay")
    lines = [(f"# Weights and wheels into N hosts ({args.size_mb} MB model in {args.shards} files, hosts at {args.rate}, "
             f"hub and controller at {args.hub_rate})"), "",
             f"Baseline: one host from the hub, {base:.1f} s (median of this run). Times are medians.", "",
             ("Machine CPU: seconds the 2 cores were busy during the weights run (tool, hub and hosts "
              "together); CPU-bound where it nears twice the wall time."), "",
             ("| hosts | strategy | weights s | × one host | machine CPU s | hub bytes (× model) "
              "| per-host MB received | wheels s | controller wheel MB |"), "|---|---|---|---|---|---|---|---|---|"]
    for count in sorted({r["hosts"] for r in runs}):
        for strategy in STRATEGIES:
            chosen = [r for r in runs if r["hosts"] == count and r["strategy"] == strategy]
            if not chosen:
                continue
            seconds = statistics.median(r["weights_s"] for r in chosen)
            hub_sent = statistics.median(r["hub_bytes"] for r in chosen)
            per_host = statistics.median(sum(sum(v.values()) for v in r["received"].values()) / count for r in chosen)
            wheels_s = statistics.median(r["venv_s"] for r in chosen)
            pushed = statistics.median(r["controller_bytes"] for r in chosen)
            machine = statistics.median(r["weights_machine_cpu_s"] for r in chosen)
            lines.append(f"| {count} | {strategy} | {seconds:.1f} | {seconds / base:.2f} | {machine:.1f} "
                         f"| {hub_sent / size:.2f} "
                         f"| {per_host / 1e6:.0f} | {wheels_s:.1f} | {pushed / 1e6:.1f} |")
    relay8 = [r for r in runs if r["hosts"] == max(r["hosts"] for r in runs) and r["strategy"] == "relay"]
    if relay8:
        ratio = statistics.median(r["weights_s"] for r in relay8) / base
        lines += ["", (f"Target: {relay8[0]['hosts']} hosts within 1.3× one host (relay): "
                      f"{ratio:.2f}× — {'met' if ratio <= 1.3 else 'missed'}.")]
    lines += ["", "Controller CPU for an unchanged cluster (`invoke plan`, median of 3): "
                  + ", ".join(f"{n} host(s) {s:.2f} s" for n, s in cpu["cpu_s"].items())
              + f"; {cpu['per_extra_host_ms']} ms per extra host, about {cpu['thousand_hosts_cpu_s']} s of CPU "
                "for 1,000 hosts."]
    (RESULTS / "transfer.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", default="1,2,4,8")
    parser.add_argument("--size-mb", type=int, default=300)
    parser.add_argument("--shards", type=int, default=4, help="files the model is split into, as real checkpoints")
    parser.add_argument("--rate", default="400mbit", help="each host's link, both ways (tc units)")
    parser.add_argument("--hub-rate", default="400mbit", help="the hub's and the controller's uplink")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--wheels", default=WHEELS, help="the venv's requirements (real wheels, resolved once)")
    args = parser.parse_args()
    counts = [int(n) for n in args.counts.split(",")]
    names = [f"bench-{n:02d}" for n in range(1, max(counts) + 1)]
    the_lab = lab.Lab()
    log(f"booting {', '.join(names)} ...")
    the_lab.up(names, progress=log)
    the_lab.shape(args.rate, args.hub_rate)
    try:
        log(f"publishing a {args.size_mb} MB model in {args.shards} files on the lab hub ...")
        publish_model(the_lab, args.size_mb * 10**6, args.shards)
        # Once before timing: every host gets the fetch helper's venv (kept across resets, as on a host
        # that was provisioned before) and the controller resolves the wheels.
        one_run(the_lab, names, "relay", args.wheels)
        runs = []
        for _ in range(args.repeat):
            for count in counts:
                for strategy in args.strategies.split(","):
                    found = one_run(the_lab, names[:count], strategy, args.wheels)
                    log(f"{count} host(s), {strategy}: weights {found['weights_s']} s, hub "
                        f"{found['hub_bytes'] / 1e6:.0f} MB; wheels {found['venv_s']} s, controller "
                        f"{found['controller_bytes'] / 1e6:.1f} MB")
                    runs.append(found)
        cpu = controller_cpu(the_lab, sorted({1, max(counts)}), args.wheels)
    finally:
        the_lab.shape(None, None)
    write_results(runs, cpu, args)


if __name__ == "__main__":
    main()
