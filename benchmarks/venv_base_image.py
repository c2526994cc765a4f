"""A service venv over a machine's own CUDA torch environment (venv_base), made as the tool's host
step makes it, on a real GPU machine: what the venv sees and whether its torch reaches the GPU.

    python3 benchmarks/venv_base_image.py --base /opt/torch/.venv --out DIR

Run as root on the machine, in a copy of this checkout (no network needed). It records the base's probe
(the tool's BASE_PROBE, as `facts` reads it), makes a venv over it with provision.host.apply.make_venv,
installs into it, with pip and no index, a wheel made here that requires the base's torch and
transformers releases (what an engine's wheel asks of the base), then reads the venv with the tool's VENV_PROBE
and runs a matrix product on the GPU with the venv's python. Everything lands in DIR/venv-base-image.json,
the probes' outputs in DIR as the unit tests' fixtures.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from provision import parsers
from provision.host import apply

GPU_CHECK = ("import torch, sys; a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16); "
             "torch.cuda.synchronize(); t = __import__('time').time(); b = a @ a; torch.cuda.synchronize(); "
             "print({'torch': torch.__version__, 'file': torch.__file__, 'cuda': torch.version.cuda, "
             "'device': torch.cuda.get_device_name(0), 'matmul_s': round(__import__('time').time() - t, 4), "
             "'finite': bool(torch.isfinite(b).all()), 'prefix': sys.prefix})")


def wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    info = f"{name}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {line}\n" for line in requires),
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: provision\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             f"{name}.py": "import torch\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(t.encode())}\n" for p, t in files.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in {**files, f"{info}/RECORD": record}.items():
            archive.writestr(member, text)
    return path


def run(argv: list[str]) -> dict[str, object]:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return {"argv": argv[:3], "exit": done.returncode, "seconds": round(time.monotonic() - started, 2),
            "stdout": done.stdout[-20000:], "stderr": done.stderr[-4000:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="/opt/torch/.venv")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    found: dict[str, object] = {}
    probe = run([f"{args.base}/bin/python", "-c", parsers.BASE_PROBE])
    (args.out / "base-probe.json").write_text(str(probe["stdout"]))
    base = parsers.parse_base_probe(str(probe["stdout"]))
    found["base"] = {"python": base.python, "executable": base.executable, "site": base.site,
                     "distributions": len(base.dists), "torch": base.version_of("torch"), "probe_s": probe["seconds"]}
    work = Path(tempfile.mkdtemp())
    wanted = [f"{name}=={base.version_of(name)}" for name in ("torch", "transformers") if base.version_of(name)]
    wheel(work, "engine_over_base", "1.0", wanted)
    venv = str(work / "venv")
    started = time.monotonic()
    pip = apply.make_venv(venv, {"python": base.executable, "site": list(base.site), "pth": parsers.BASE_PTH})
    found["make_venv_s"] = round(time.monotonic() - started, 2)
    found["install"] = run(pip + ["install", "--no-index", "--find-links", str(work), "--disable-pip-version-check",
                                  "engine_over_base==1.0"])
    found["venv_own"] = sorted(p.name for p in Path(venv).glob("lib/python*/site-packages/*"))
    probed = run([f"{venv}/bin/python", "-c", parsers.VENV_PROBE, "engine_over_base"])
    (args.out / "venv-probe.json").write_text(str(probed["stdout"]))
    info = parsers.parse_venv_probe(str(probed["stdout"]))
    found["venv_probe"] = {"torch": info.torch, "cuda": info.cuda, "arch_flags": info.arch_flags, "nccl": info.nccl,
                           "requires": info.requires, "seconds": probed["seconds"]}
    found["gpu"] = run([f"{venv}/bin/python", "-c", GPU_CHECK])
    (args.out / "venv-base-image.json").write_text(json.dumps(found, indent=1, default=str))
    print(json.dumps(found, indent=1, default=str)[-6000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
