"""What a service venv with a CUDA torch costs `facts --host local`, before and after a change.

    python3 benchmarks/facts_venv.py --venv /opt/torch/.venv --tree before=/path/to/old --tree after=.

On a GPU machine, as root. For each tree (a checkout of this project: its `tasks.py` runs), it times
`python3 -m invoke facts --host local --json` with /opt/vllm/venv pointing at the given venv and with
no /opt/vllm/venv at all, `--repeat` times each, one after the other in the same run, and prints the
median of each with the ratio of "with the venv" over "without" (the baseline of the same tree and
run). The host's probe cache is removed before each tree's first run, so that run is the one that
fills it (shown apart as "first"). /opt/vllm/venv is put back as it was found.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

SERVICE_VENV = Path("/opt/vllm/venv")
PROBE_CACHE = Path("/var/cache/provision/probe-cache.json")


def timed_facts(tree: Path) -> tuple[float, dict]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "invoke", "facts", "--host", "local", "--json"], cwd=tree,
                          capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{tree}: facts failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return took, json.loads(done.stdout)["hosts"]["local"]


def with_service_venv(venv: Path | None) -> None:
    if SERVICE_VENV.is_symlink() or SERVICE_VENV.exists():
        SERVICE_VENV.unlink()
    if venv is not None:
        SERVICE_VENV.parent.mkdir(parents=True, exist_ok=True)
        SERVICE_VENV.symlink_to(venv)


def measure(name: str, tree: Path, venv: Path, repeat: int) -> dict:
    PROBE_CACHE.unlink(missing_ok=True)
    with_service_venv(venv)
    first, found = timed_facts(tree)
    warm = [timed_facts(tree)[0] for _ in range(repeat)]
    with_service_venv(None)
    bare = [timed_facts(tree)[0] for _ in range(repeat)]
    row = {"tree": name, "first_with_venv_s": round(first, 3),
           "with_venv_s": round(statistics.median(warm), 3), "without_venv_s": round(statistics.median(bare), 3),
           "venv": found.get("venv"), "probe": found.get("probe")}
    row["ratio"] = round(row["with_venv_s"] / row["without_venv_s"], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, required=True, help="a venv holding a CUDA torch")
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH of a checkout (repeatable)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()
    kept = os.readlink(SERVICE_VENV) if SERVICE_VENV.is_symlink() else None
    if SERVICE_VENV.exists() and kept is None:
        raise SystemExit(f"{SERVICE_VENV} is a real directory here: this benchmark replaces it, so it stops")
    rows = []
    try:
        for entry in args.tree:
            name, _, path = entry.partition("=")
            rows.append(measure(name, Path(path).resolve(), args.venv, args.repeat))
    finally:
        with_service_venv(Path(kept) if kept else None)
        if kept is None and SERVICE_VENV.parent.exists() and not any(SERVICE_VENV.parent.iterdir()):
            shutil.rmtree(SERVICE_VENV.parent)
    print(f"facts --host local, median of {args.repeat} (first: the run with an empty probe cache)")
    print(f"{'tree':<10} {'first':>8} {'with venv':>10} {'without':>9} {'ratio':>6}")
    for row in rows:
        print(f"{row['tree']:<10} {row['first_with_venv_s']:>8.2f} {row['with_venv_s']:>10.2f} "
              f"{row['without_venv_s']:>9.2f} {row['ratio']:>5.2f}x")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
