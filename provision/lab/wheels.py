"""Small wheels for the lab's package index: a stand-in `torch` per PyTorch variant (cu128 ... cpu),
and a stand-in `ray` beside each (the venv of a two-node vLLM cluster must hold Ray).

PyTorch publishes each CUDA build on its own index with the variant as the version's local part
(`torch-2.9.0+cu130-…whl`). The lab's index serves wheels named the same way, a few hundred bytes each,
so the controller's resolve (pip download with the inventory's index settings), the variant pin and the
driver rule meet real pip and a real index without the gigabytes. They are never meant to be imported
for real work: `torch.version.cuda` says the variant's CUDA and nothing else exists.
"""
from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

# variant -> the CUDA release torch.version.cuda reports (None: the CPU build)
VARIANTS = {"cu128": "12.8", "cu129": "12.9", "cu130": "13.0", "cpu": None}
TORCH_VERSION = "2.9.0"
# The Ray the contract table names for the vLLM releases it knows, with a local label of the lab's own: the
# lab's index is an extra one beside PyPI, and an exact pin of it is never PyPI's real Ray (which pip
# would take over a pure-Python wheel of the same version).
RAY_VERSION = "2.60.0+lab"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A valid pure-Python wheel (METADATA, WHEEL, RECORD) holding `files`; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    dist_info = f"{name}-{version}.dist-info"
    contents = {path: text.encode() for path, text in files.items()}
    contents[f"{dist_info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                         f"Summary: lab stand-in for {name} {version}\n").encode()
    contents[f"{dist_info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: provision-lab\nRoot-Is-Purelib: true\n"
                                      b"Tag: py3-none-any\n")
    record = [_record_line(path, data) for path, data in contents.items()] + [f"{dist_info}/RECORD,,"]
    contents[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in contents.items():
            info = zipfile.ZipInfo(member, date_time=(2026, 1, 1, 0, 0, 0))  # the same bytes every time
            archive.writestr(info, data)
    return path


def torch_variants(directory: Path) -> dict[str, Path]:
    """{variant: wheel} of the stand-in torch, e.g. {'cu130': .../torch-2.9.0+cu130-py3-none-any.whl}."""
    made = {}
    for variant, cuda in VARIANTS.items():
        version = f"{TORCH_VERSION}+{variant}"
        made[variant] = make_wheel(directory / variant, "torch", version, {
            "torch/__init__.py": f"__version__ = {version!r}\nfrom torch import version\n",
            "torch/version.py": f"cuda = {cuda!r}\n",
        })
    return made


def stand_ins(directory: Path) -> dict[str, list[Path]]:
    """{variant: wheels} the lab's index serves under that variant: its torch and the stand-in ray."""
    ray = make_wheel(directory / "any", "ray", RAY_VERSION, {"ray/__init__.py": f"__version__ = {RAY_VERSION!r}\n"})
    return {variant: [torch, ray] for variant, torch in torch_variants(directory).items()}


def venv_spec() -> str:
    """A lab cluster's vllm_spec made of the stand-ins: resolved from the lab's index, no gigabytes."""
    return f"torch=={TORCH_VERSION} ray=={RAY_VERSION}"
