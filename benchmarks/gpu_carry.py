"""Makes what `gpu_host.py --engine vllm` needs on a GPU machine that reaches no network, from this
machine's package registries, in parts small enough to travel one at a time.

    python3 benchmarks/gpu_carry.py --out .gpuhost            # then: ls .gpuhost/parts

Run here, as root (apt-get download for the .debs), on any x86-64 machine with Python and pip. It writes:

- `.gpuhost/base/`: boot-container.sh and debs/ (systemd 252, the workplace's gpu-host scripts), wheels/
  (the tool's own wheel and its dependencies, cp312 x86-64), and the base environment's record it was
  resolved around;
- `.gpuhost/parts/pN/`: the engine's index, the wheels the tool's own resolve fetches on that host for
  `--engine-spec` over the machine's base environment (`venv_base`: the image's CUDA torch, recorded in
  tests/fixtures/venv_base/), each part at most `--part-mib`; a wheel larger than that travels in
  chunks (`NAME.chunkNN`) with its sha256 (`NAME.sha256`), made whole there.

The engine's wheels are what `provision.venv.resolve` fetches for that host (the same function the
tool's deploy calls, with the same base environment), and the maker checks the result the way that
host will use it: resolved again from those files alone (no index), it must come to the same wheels.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from provision import parsers, venv

GPU_HOST_SCRIPTS = ROOT.parent / "shared" / "gpu-host"
IMAGE_BASE = ROOT / "tests" / "fixtures" / "venv_base" / "h100-image-opt-torch-venv.json"
PLATFORM_ARGS = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                 *(arg for tag in venv.PIP_PLATFORMS["x86_64"] for arg in ("--platform", tag))]


def say(text: str) -> None:
    print(text, flush=True)


def base_part(out: Path, base_record: Path) -> None:
    """The container's scripts and .debs, and the tool's own wheels."""
    base = out / "base"
    (base / "debs").mkdir(parents=True, exist_ok=True)
    for script in ("boot-container.sh",):
        shutil.copy2(GPU_HOST_SCRIPTS / script, base / script)
    if not list((base / "debs").glob("*.deb")):
        say("debs: systemd 252 and its libraries (apt-get download)")
        subprocess.run(["bash", str(GPU_HOST_SCRIPTS / "fetch-debs.sh"), str(base / "debs")], check=True)
    wheels = base / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir()
    say("wheels: the tool's own wheel and its dependencies for cp312 x86-64")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)], check=True)
    tool = next(wheels.glob("provision-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels), *PLATFORM_ARGS, str(tool)],
                   check=True)
    shutil.copy2(base_record, base / "venv-base.json")


def engine_wheels(spec: str, provided: parsers.BaseEnv) -> list[Path]:
    """What the tool's resolve fetches for `spec` over the base environment, and the same resolve
    again from those files alone (as the air-gapped host runs it): both must agree."""
    say(f"engine: resolving {spec} around the base environment's {len(provided.dists)} distributions")
    house = venv.resolve([spec], [], "x86_64", provided.python, progress=say, provided=provided.dists)
    files = sorted(house.directory / wheel.name for wheel in house.wheels)
    with tempfile.TemporaryDirectory() as scratch:
        environment = {"PROVISION_WHEELHOUSE": scratch, "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull,
                       "PIP_FIND_LINKS": str(house.directory)}
        saved = {key: os.environ.get(key) for key in [*environment, "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"]}
        os.environ.update(environment)
        for key in ("PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
            os.environ.pop(key, None)
        try:
            again = venv.resolve([spec], [], "x86_64", provided.python, provided=provided.dists)
        finally:
            for key, value in saved.items():
                os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        if sorted(w.name for w in again.wheels) != sorted(w.name for w in house.wheels):
            raise SystemExit("the wheels resolved from the carried files alone differ from the index's: "
                             f"{sorted({w.name for w in house.wheels} ^ {w.name for w in again.wheels})}")
    return files


def split_into_parts(files: list[Path], parts: Path, limit: int) -> list[Path]:
    """Files into folders of at most `limit` bytes, largest first; a file over `limit` in chunks."""
    shutil.rmtree(parts, ignore_errors=True)
    pieces: list[tuple[str, bytes | Path, int]] = []
    for path in files:
        size = path.stat().st_size
        if size <= limit:
            pieces.append((path.name, path, size))
            continue
        data = path.read_bytes()
        pieces.append((f"{path.name}.sha256", hashlib.sha256(data).hexdigest().encode(), 64))
        for index, start in enumerate(range(0, size, limit)):
            chunk = data[start:start + limit]
            pieces.append((f"{path.name}.chunk{index:02d}", chunk, len(chunk)))
    folders: list[tuple[Path, int]] = []
    for name, source, size in sorted(pieces, key=lambda piece: -piece[2]):
        slot = next((i for i, (_, used) in enumerate(folders) if used + size <= limit), None)
        if slot is None:
            folders.append((parts / f"p{len(folders) + 1}", 0))
            slot = len(folders) - 1
        folder, used = folders[slot]
        folder.mkdir(parents=True, exist_ok=True)
        if isinstance(source, Path):
            shutil.copy2(source, folder / name)
        else:
            (folder / name).write_bytes(source)
        folders[slot] = (folder, used + size)
    return [folder for folder, _ in folders]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".gpuhost"))
    parser.add_argument("--engine-spec", default="vllm==0.26.0")
    parser.add_argument("--base", type=Path, default=IMAGE_BASE,
                        help="the machine's base environment, as the tool's venv_base probe recorded it")
    parser.add_argument("--part-mib", type=int, default=52, help="largest part (what one call carries)")
    args = parser.parse_args()
    provided = parsers.parse_base_probe(args.base.read_text())
    base_part(args.out, args.base)
    files = engine_wheels(args.engine_spec, provided)
    total = sum(path.stat().st_size for path in files)
    folders = split_into_parts(files, args.out / "parts", args.part_mib * 2**20)
    listing = {"engine_spec": args.engine_spec, "wheels": [path.name for path in files], "bytes": total,
               "parts": {folder.name: sorted(p.name for p in folder.iterdir()) for folder in folders}}
    (args.out / "base" / "carry.json").write_text(json.dumps(listing, indent=1))
    say(f"{len(files)} wheels, {total / 2**20:.0f} MiB, in {len(folders)} parts under {args.out / 'parts'}; "
        f"base: {sum(p.stat().st_size for p in (args.out / 'base').rglob('*') if p.is_file()) / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
