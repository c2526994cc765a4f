"""verify.nccl beside nccl-tests' all_reduce_perf, on one machine, in one run.

    python3 benchmarks/nccl_tests.py --nccl-tests SRC --venv VENV [--profile hopper] [--out DIR]

On a machine with two or more GPUs, CUDA's nvcc and a venv holding a CUDA torch with NVIDIA's NCCL wheel
(the service venv; nothing is installed and nothing is fetched). In order, in the same run:

1. `invoke verify.nccl --host local --profile P --set venv_dir=VENV --json` from this checkout (1 MiB to
   1 GiB), which runs its ranks in the service environment the profile renders and reports, per rendered
   NCCL_* variable, whether NCCL read it;
2. nccl-tests built from SRC (a checkout of NVIDIA/nccl-tests) against the same NCCL (the venv's
   nvidia/nccl: its headers and libnccl.so.2), for this GPU's compute capability alone;
3. `all_reduce_perf -b 1M -e 1G -f 2 -t N -g 1` (a thread per GPU, as verify.nccl runs a process per GPU)
   with the same NCCL_* variables, NCCL_DEBUG left out.

It prints both busbw columns per size with verify.nccl's over nccl-tests' out-of-place figure (the
baseline, measured in the same run), the table of rendered NCCL variables, and writes both answers
verbatim to DIR. With one GPU verify.nccl refuses (nothing to all-reduce across): the build and
all_reduce_perf still run, so the program itself is checked there. Exit 0 when both ran.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SIZES = ("1M", "1G")


def parse_all_reduce_perf(text: str) -> dict[int, tuple[float, float]]:
    """nccl-tests' table: {size in bytes: (out-of-place busbw, in-place busbw)} in GB/s."""
    rows: dict[int, tuple[float, float]] = {}
    for line in text.splitlines():
        fields = line.split()
        if not line.lstrip().startswith("#") and len(fields) == 13 and fields[0].isdigit():
            rows[int(fields[0])] = (float(fields[7]), float(fields[11]))
    return rows


def nccl_of(venv: Path) -> Path:
    """The NCCL wheel's directory in the venv (include/nccl.h, lib/libnccl.so.2)."""
    found = sorted(venv.glob("lib/python3*/site-packages/nvidia/nccl"))
    if not found or not (found[0] / "include" / "nccl.h").is_file():
        raise SystemExit(f"{venv}: no nvidia/nccl with include/nccl.h (the nvidia-nccl wheel)")
    return found[0]


def nccl_home(wheel: Path, into: Path) -> Path:
    """An NCCL_HOME for nccl-tests' Makefile: the wheel's headers, and libnccl.so for the linker."""
    (into / "lib").mkdir(parents=True)
    (into / "include").symlink_to(wheel / "include")
    library = next(iter(sorted((wheel / "lib").glob("libnccl.so*"))))
    (into / "lib" / "libnccl.so").symlink_to(library)
    (into / "lib" / library.name).symlink_to(library)
    return into


def compute_capability() -> str:
    answer = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                            capture_output=True, text=True, check=True).stdout.split()
    return answer[0].replace(".", "")


def build(source: Path, home: Path, build_dir: Path, out: Path) -> Path:
    """all_reduce_perf built in build_dir (its log kept in out) for this GPU's compute capability."""
    arch = compute_capability()
    cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    done = subprocess.run(["make", "-C", str(source / "src"), f"-j{os.cpu_count() or 4}", "MPI=0",
                           f"NCCL_HOME={home}", f"CUDA_HOME={cuda}", f"BUILDDIR={build_dir}",
                           f"NVCC_GENCODE=-gencode=arch=compute_{arch},code=sm_{arch}"],
                          capture_output=True, text=True, check=False)
    (out / "nccl-tests-build.log").write_text(done.stdout + done.stderr)
    binary = build_dir / "all_reduce_perf"
    if done.returncode != 0 or not binary.is_file():
        raise SystemExit(f"nccl-tests did not build (exit {done.returncode}): {done.stderr[-2000:]}")
    return binary


def verify(venv: Path, profile: str) -> tuple[int, dict[str, Any] | None, str]:
    argv = [sys.executable, "-m", "invoke", "verify.nccl", "--host", "local", "--profile", profile,
            "--set", f"venv_dir={venv}", "--min-bytes", SIZES[0], "--max-bytes", SIZES[1], "--json"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    try:
        answer = json.loads(done.stdout)
    except json.JSONDecodeError:
        answer = None
    return done.returncode, answer, done.stdout + done.stderr


def nccl_environment(run: Mapping[str, Any]) -> dict[str, str]:
    """The rendered NCCL_* variables verify.nccl ran with, without its own NCCL_DEBUG*."""
    shown = next(iter(run.get("environment", {}).values()), {})
    return {k: v for k, v in shown.items() if k.startswith("NCCL_") and not k.startswith("NCCL_DEBUG")}


def all_reduce_perf(binary: Path, home: Path, gpus: int, environment: Mapping[str, str]) -> str:
    env = {**os.environ, **environment, "LD_LIBRARY_PATH": f"{home / 'lib'}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    argv = [str(binary), "-b", SIZES[0], "-e", SIZES[1], "-f", "2", "-t", str(gpus), "-g", "1", "-w", "5", "-n", "20"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"all_reduce_perf failed (exit {done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
    return done.stdout


def comparison(verify_rows: Sequence[Mapping[str, Any]], reference: Mapping[int, tuple[float, float]]) -> list[str]:
    lines = ["| size | verify.nccl busbw (GB/s) | all_reduce_perf out-of-place | in-place | ratio to out-of-place |",
             "|---|---|---|---|---|"]
    for row in verify_rows:
        size = int(row["bytes"])
        if size not in reference:
            continue
        out_of_place, in_place = reference[size]
        ratio = row["busbw_gbs"] / out_of_place if out_of_place else float("nan")
        lines.append(f"| {size >> 20} MiB | {row['busbw_gbs']:.2f} | {out_of_place:.2f} | {in_place:.2f} | {ratio:.3f} |")
    return lines


def reads(run: Mapping[str, Any]) -> list[str]:
    lines = ["| host | variable | rendered | NCCL read | verdict |", "|---|---|---|---|---|"]
    for host, variables in run.get("nccl_reads", {}).items():
        for name, read in variables.items():
            lines.append(f"| {host} | {name} | {read['rendered']} | {read['read'] if read['read'] is not None else '-'} "
                         f"| {read['verdict']} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nccl-tests", type=Path, required=True, help="a checkout of NVIDIA/nccl-tests")
    parser.add_argument("--venv", type=Path, required=True, help="the service venv (CUDA torch, nvidia-nccl wheel)")
    parser.add_argument("--profile", default="hopper", help="the hardware profile whose environment is rendered")
    parser.add_argument("--out", type=Path, default=Path("nccl-tests-results"), help="where the answers are kept")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    code, answer, printed = verify(args.venv, args.profile)
    (args.out / "verify-nccl.txt").write_text(printed)
    run = (answer or {}).get("runs", {}).get("local")
    if run is None:
        print(f"verify.nccl gave no run (exit {code}): {(answer or {}).get('errors') or printed[-1000:]}")
    with tempfile.TemporaryDirectory() as temporary:
        home = nccl_home(nccl_of(args.venv), Path(temporary) / "nccl")
        binary = build(args.nccl_tests, home, Path(temporary) / "build", args.out)
        gpus = len(run["devices"]) if run else 1
        environment = nccl_environment(run) if run else {}
        text = all_reduce_perf(binary, home, gpus, environment)
    (args.out / "all_reduce_perf.txt").write_text(text)
    reference = parse_all_reduce_perf(text)
    print(f"all_reduce_perf -t {gpus} -g 1 with {' '.join(f'{k}={v}' for k, v in environment.items()) or 'no NCCL_*'}")
    if run is None:  # nccl-tests alone: the build and the run are checked, there is nothing to compare
        print("| size | all_reduce_perf out-of-place busbw | in-place |\n|---|---|---|")
        print("\n".join(f"| {size >> 20} MiB | {oop:.2f} | {ip:.2f} |" for size, (oop, ip) in reference.items()))
        return 1
    print(f"verify.nccl: {run['world_size']} GPUs ({', '.join(run['devices'])}), torch {run['torch']}, NCCL {run['nccl']}")
    print("\n".join(comparison(run["results"], reference)))
    print()
    print("\n".join(reads(run)))
    for finding in run.get("findings", []):
        print(f"finding: {finding}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
