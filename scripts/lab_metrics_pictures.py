"""Draw the documentation's dashboard pictures from the lab's own data.

The endpoint lab-tiny (cpu-2's router in front of lab-llama on cpu-2 and lab-llama-b on cpu-3) under a
steady load, both replicas rolled once meanwhile, scraped every second by a Prometheus on cpu-2 that the
tool put there (`prepare`, `metrics --apply`); then panels of the shipped dashboards drawn with
scripts/draw_panel.py; then Prometheus removed, cpu-3 forgotten and lab-llama deployed as the lab has it.

    python3 scripts/lab_metrics_pictures.py --out docs/img       # the lab up (`invoke lab.up`), as root
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import draw_panel

from provision import inventory, lab

PICTURES = (("endpoint", "Requests per Replica", "endpoint-requests-per-replica.png"),
            ("endpoint", "Replicas Up", "endpoint-replicas-up.png"),
            ("llamacpp", "Token Throughput", "llamacpp-token-throughput.png"))
ROLL = ["--set", "environment={PROVISION_LAB_PICTURE: '1'}"]


def invoke(*args: str, timeout: float = 1800) -> str:
    done = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise SystemExit(f"invoke {' '.join(args)}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def on_host(inv: inventory.Inventory, host: str, argv: list[str]) -> None:
    from provision import remote

    runner = remote.SshRunner(inv.host(host), inv.ssh)
    try:
        runner.run(argv)
    finally:
        runner.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--load-minutes", type=float, default=4.0)
    args = parser.parse_args(argv)
    the_lab = lab.Lab()
    the_lab.up(["cpu-2", "cpu-3"], progress=lambda line: print(line, file=sys.stderr))
    inv = inventory.load(the_lab.inventory)
    document = yaml.safe_load(the_lab.inventory.read_text())
    document["prometheus"] = {"host": "cpu-2", "bind_host": "0.0.0.0", "scrape_interval": "1s", "retention": "1d"}
    path = Path("/tmp/lab-metrics-pictures.yaml")
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    url = f"http://{inv.host('cpu-2').address}:9090"
    try:
        invoke("prepare", "--host", "cpu-2", "--inventory", str(path))
        for cluster in ("lab-llama-b", "lab-llama"):
            invoke("deploy", "--cluster", cluster, "--timeout", "420")
        print(invoke("metrics", "--apply", "--inventory", str(path)))
        stop = threading.Event()

        def load() -> None:  # bench runs one after the other until stopped: a steady load
            while not stop.is_set():
                invoke("bench", "--endpoint", "lab-tiny", "--count", "24", "--concurrency", "4", "--max-tokens", "16")

        loading = threading.Thread(target=load)
        loading.start()
        started = time.monotonic()
        time.sleep(args.load_minutes * 60 / 4)
        for cluster in ("lab-llama-b", "lab-llama"):  # a rolling deploy of each replica, under the load
            invoke("deploy", "--cluster", cluster, *ROLL, "--timeout", "300")
            time.sleep(args.load_minutes * 60 / 4)
        time.sleep(max(0.0, args.load_minutes * 60 - (time.monotonic() - started)))
        stop.set()
        loading.join()
        time.sleep(5)
        for dashboard, panel, name in PICTURES:
            code = draw_panel.main(["--prometheus", url, "--dashboard", dashboard, "--panel", panel,
                                    "--minutes", str(args.load_minutes + 1), "--rate-interval", "10s",
                                    "--out", str(args.out / name)])
            if code:
                return code
    finally:
        on_host(inv, "cpu-2", ["apt-get", "purge", "-y", "-q", "--autoremove", "prometheus"])
        on_host(inv, "cpu-2", ["rm", "-rf", "/etc/prometheus", "/var/lib/prometheus", "/etc/default/prometheus"])
        on_host(inv, "cpu-2", ["userdel", "prometheus"])
        the_lab.remove(["cpu-3"])
        invoke("deploy", "--cluster", "lab-llama", "--timeout", "420")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
