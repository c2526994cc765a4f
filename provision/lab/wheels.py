"""Small wheels for the lab's package index: a stand-in `torch` per PyTorch variant (cu128 ... cpu),
a stand-in `ray` beside each (the venv of a two-node vLLM cluster over Ray must hold Ray), and stand-in
`vllm` releases: one with vLLM's own multi-node launch, whose modules start lab/pair_engine.py (two lab
hosts serve as one, without vLLM's gigabytes), and one from before it (its nodes go over Ray).

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
# The stand-in vLLM releases: the table's target (vLLM's own multi-node launch) and one before 0.11.1,
# which has none (the tool renders Ray for it); that one requires Ray itself, as vLLM 0.11.0's wheel does.
# The local label names the stand-in engine's source: a changed one is a new wheel, never a cached old one.
PAIR_ENGINE = Path(__file__).with_name("pair_engine.py")
_ENGINE_LABEL = hashlib.sha256(PAIR_ENGINE.read_bytes()).hexdigest()[:8]
VLLM_NATIVE = f"0.34.0+lab.{_ENGINE_LABEL}"
VLLM_BEFORE_NATIVE = f"0.11.0+lab.{_ENGINE_LABEL}"
# FlashInfer's prebuilt kernels at the release vLLM 0.34.0 pins (flashinfer-python 0.7.3): a real venv of
# a GPU host without NVIDIA's artifactory in reach must hold them (known.vllm-flashinfer-cubin-airgapped,
# which the lab's Spark hosts, reaching nothing, would be warned of), so the lab's holds a stand-in.
FLASHINFER_CUBIN = "0.7.3+lab"
# The modules the tool starts (engine_contracts.yaml: entrypoint and headless rows), each a door to the
# stand-in engine.
VLLM_DOORS = {"vllm/entrypoints/launchers/api_server/entry.py": "head",
              "vllm/entrypoints/openai/api_server.py": "head",
              "vllm/entrypoints/cli/main.py": "worker if '--headless' in sys.argv else head"}


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(directory: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> Path:
    """A valid pure-Python wheel (METADATA, WHEEL, RECORD) holding `files`; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    dist_info = f"{name}-{version}.dist-info"
    contents = {path: text.encode() for path, text in files.items()}
    contents[f"{dist_info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                         f"Summary: lab stand-in for {name} {version}\n"
                                         + "".join(f"Requires-Dist: {line}\n" for line in requires)).encode()
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


def vllm_wheel(directory: Path, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A stand-in vLLM release: the modules the tool starts, each running lab/pair_engine.py."""
    engine = PAIR_ENGINE.read_text(encoding="utf-8")
    files = {"vllm/__init__.py": f"__version__ = {version!r}\n", "vllm/_lab_pair.py": engine}
    for module, role in VLLM_DOORS.items():
        parts = module.split("/")
        for depth in range(2, len(parts)):
            files.setdefault("/".join(parts[:depth]) + "/__init__.py", "")
        files[module] = (f"import sys\n\nfrom vllm._lab_pair import head, worker\n\n"
                         f"if __name__ == '__main__':\n    ({role})(sys.argv[1:])\n")
    return make_wheel(directory, "vllm", version, files, requires)


def stand_ins(directory: Path) -> dict[str, list[Path]]:
    """{variant: wheels} the lab's index serves under that variant: its torch, the stand-in ray and vLLMs."""
    ray = make_wheel(directory / "any", "ray", RAY_VERSION, {"ray/__init__.py": f"__version__ = {RAY_VERSION!r}\n"})
    vllms = [vllm_wheel(directory / "any", VLLM_NATIVE),
             vllm_wheel(directory / "any", VLLM_BEFORE_NATIVE, (f"ray=={RAY_VERSION}",))]
    cubin = make_wheel(directory / "any", "flashinfer_cubin", FLASHINFER_CUBIN,
                       {"flashinfer_cubin/__init__.py": f"__version__ = {FLASHINFER_CUBIN!r}\n"})
    return {variant: [torch, ray, cubin, *vllms] for variant, torch in torch_variants(directory).items()}


def venv_spec(vllm: str = VLLM_NATIVE) -> str:
    """A lab cluster's engine_spec made of the stand-ins: resolved from the lab's index, no gigabytes."""
    return f"vllm=={vllm} torch=={TORCH_VERSION} flashinfer-cubin=={FLASHINFER_CUBIN}"
