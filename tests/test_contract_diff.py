"""The static reader of vLLM wheels (provision/vllm_wheel.py) and the contract diff on top of it, on the
files of the 0.33.0 and 0.34.0 wheels the reader needs (tests/fixtures/wheels/, copied verbatim; the wheels
and their sha256 in sources.json).

The serve options are held to what vLLM's own parser registered for the same sources
(vllm-<version>.parser-options.json, recorded by running make_arg_parser), not to what the reader says."""
from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from provision import contract_diff, contracts, vllm_wheel
from provision.errors import WheelReadError
from tests.test_render import GOLDEN, rendered_lines

FIXTURES = Path(__file__).parent / "fixtures" / "wheels"
REPORTS = Path(contracts.__file__).parent / "contract_reports"
RELEASES = ("0.33.0", "0.34.0")
SOURCES = json.loads((FIXTURES / "sources.json").read_text())


def release(version: str) -> vllm_wheel.Release:
    return vllm_wheel.open_release(FIXTURES / f"vllm-{version}")


def table(*rows: dict[str, str], target: str = "0.33.0", arity: dict[str, str] | None = None) -> contracts.Contracts:
    """A table of these rows; its arity the shipped table's (the same in 0.33.0 and 0.34.0) unless given."""
    base = {"engine": "vllm", "source": "https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/envs.py"}
    held = dict(contracts.load().arity("vllm")) if arity is None else arity
    return contracts.parse({"engines": {"vllm": {"target": target, "packages": ["vllm"], "arity": held}},
                            "rows": [{**base, **row} for row in rows]}, "test")


@pytest.mark.parametrize("version", RELEASES)
def test_the_fixtures_are_the_files_sources_json_names_and_only_those(version: str) -> None:
    entry = SOURCES["releases"][f"vllm-{version}"]
    assert entry["wheel"] == f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert len(entry["sha256"]) == 64 and entry["url"].startswith("https://pypi.org/project/vllm/")
    held = {path.relative_to(FIXTURES / f"vllm-{version}").as_posix()
            for path in (FIXTURES / f"vllm-{version}").rglob("*") if path.is_file()}
    assert held == set(entry["files"])
    # ... and the reader needs each of them: reading everything opens every one
    opened = release(version)
    contract_diff.judge(contracts.load(), contract_diff.read(opened))
    assert held <= opened.read


@pytest.mark.parametrize("version", RELEASES)
def test_serve_options_are_the_option_strings_vllms_own_parser_registers(version: str) -> None:
    recorded = json.loads((FIXTURES / f"vllm-{version}.parser-options.json").read_text())["options"]
    read = vllm_wheel.serve_options(release(version))
    assert sorted(read.options) == sorted(recorded)
    assert read.parser_module == "vllm/entrypoints/common/cli_args.py"


def test_boolean_options_get_their_no_and_their_enable_disable_forms() -> None:
    """0.33.0's FlexibleArgumentParser registers EnableDisableAction for BooleanOptionalAction: a boolean
    config field --enable-X also answers to --no-enable-X and --disable-X."""
    options = vllm_wheel.serve_options(release("0.33.0")).options
    for form in ("--enable-prefix-caching", "--no-enable-prefix-caching", "--disable-prefix-caching"):
        assert options[form] == "vllm/engine/arg_utils.py", form
    assert "--trust-remote-code" in options and "--no-trust-remote-code" in options
    assert "--no-max-num-seqs" not in options  # an int field: no negative form
    assert "--enable-log-stats" not in options  # --disable-log-stats is a store_true: no pair
    assert options["--api-key"] == "vllm/entrypoints/common/cli_args.py"  # FrontendArgs' fields, by a loop


def test_a_flag_new_in_034_is_read_there_and_not_in_033() -> None:
    old = vllm_wheel.serve_options(release("0.33.0")).options
    new = vllm_wheel.serve_options(release("0.34.0")).options
    assert "--shuffle-safetensors-files" in new and "--shuffle-safetensors-files" not in old
    assert set(old) <= set(new)


def test_environment_variables_are_envs_py_keys() -> None:
    variables = vllm_wheel.environment_variables(release("0.33.0"))
    assert variables["VLLM_CONFIG_ROOT"] == "vllm/envs.py"
    assert "VLLM_ATTENTION_BACKEND" not in variables
    assert "VLLM_USE_RAY_V2_EXECUTOR_BACKEND" not in variables  # 0.33.0's Ray executor is V2 only


def test_counters_are_served_with_total_once() -> None:
    names = vllm_wheel.metric_names(release("0.33.0"))
    assert names["vllm:prompt_tokens_total"] == "vllm/v1/metrics/loggers.py"
    assert "vllm:prompt_tokens" not in names
    assert names["vllm:num_requests_running"] == "vllm/v1/metrics/loggers.py"  # a gauge: as registered
    assert "vllm:estimated_flops_per_gpu_total" in names and "vllm:estimated_flops_per_gpu_total_total" not in names
    assert "vllm:cache_config_info" in names  # the info gauge, named by assignment in log_metrics_info


def test_requirements_leave_the_extras_out() -> None:
    required = {str(item) for item in release("0.33.0").requirements()}
    assert {"torch==2.14.0", "torchvision==0.29.0", "flashinfer-python==0.7.2.post1"} <= required
    assert not any(item.startswith("pandas") for item in required)  # extra == "bench" only


def test_a_row_the_release_contradicts_differs_both_ways() -> None:
    rows = table({"kind": "flag", "name": "--shuffle-safetensors-files", "versions": "<0.34.0"},
                 {"kind": "flag", "name": "--max-num-seqs", "versions": ">=0.12.0"},
                 {"kind": "env", "name": "VLLM_ATTENTION_BACKEND", "versions": ">=0.10.0"},
                 {"kind": "entrypoint", "name": "vllm.entrypoints.launchers.api_server.entry", "versions": ">=0.29.0"},
                 {"kind": "dependency", "name": "torch==2.14.0", "versions": "==0.33.0"})
    verdicts = {verdict.row.name: verdict for verdict in contract_diff.judge(rows, contract_diff.read(release("0.34.0")))}
    assert verdicts["--shuffle-safetensors-files"].differs  # the wheel has it, the range says not
    assert verdicts["--shuffle-safetensors-files"].where == "vllm/engine/arg_utils.py"
    assert verdicts["VLLM_ATTENTION_BACKEND"].differs  # the range says so, envs.py has no such key
    assert not verdicts["--max-num-seqs"].differs
    assert not verdicts["vllm.entrypoints.launchers.api_server.entry"].differs
    assert verdicts["torch==2.14.0"].differs  # 0.34.0 still pins it: the range should say so
    assert verdicts["torch==2.14.0"].detail == "requires torch==2.14.0"


def test_a_dependency_the_wheel_does_not_require_is_the_tools_to_install() -> None:
    rows = table({"kind": "dependency", "name": "ray==2.60.0", "versions": ">=0.18.0"},
                 {"kind": "dependency", "name": "flashinfer-python==0.7.2.post1", "versions": ">=0.33.0"})
    verdicts = contract_diff.judge(rows, contract_diff.read(release("0.34.0")))
    ray, flashinfer = verdicts
    assert not ray.differs and ray.detail == "requires no ray: the tool's to install"
    assert flashinfer.differs and flashinfer.detail == "requires flashinfer-python==0.7.3"


def test_a_file_row_is_looked_for_in_the_file_its_source_names() -> None:
    source = "https://github.com/vllm-project/vllm/blob/v0.17.0/vllm/ray/ray_env.py"
    rows = table({"kind": "file", "name": "ray_non_carry_over_env_vars.json", "versions": ">=0.17.0", "source": source},
                 {"kind": "file", "name": "no_such_file.json", "versions": ">=0.17.0", "source": source},
                 {"kind": "file", "name": "x.json", "versions": ">=0.17.0", "source": "https://github.com/o/r/pull/1"})
    found, missing, unknown = contract_diff.judge(rows, contract_diff.read(release("0.33.0")))
    assert found.wheel is True and found.where == "vllm/ray/ray_env.py" and not found.differs
    assert missing.wheel is False and missing.differs
    assert unknown.wheel is None and not unknown.differs


@pytest.mark.parametrize("version", RELEASES)
def test_the_kept_report_is_what_the_program_prints_now(version: str, capsys: pytest.CaptureFixture[str]) -> None:
    """provision/contract_reports/ beside the table: a table change that alters a report fails here until
    the report is printed again (`python -m provision.contract_diff tests/fixtures/wheels/vllm-VERSION`)."""
    code = contract_diff.main([str(FIXTURES / f"vllm-{version}")])
    printed = capsys.readouterr().out
    assert printed == (REPORTS / f"vllm-{version}.txt").read_text()
    assert code == (1 if "\n  table: " in printed else 0)


def test_exit_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    differing = table({"kind": "flag", "name": "--max-num-seqs", "versions": "<0.12.0"})
    monkeypatch.setattr(contracts, "load", lambda: differing)
    assert contract_diff.main([str(FIXTURES / "vllm-0.33.0")]) == 1
    out = capsys.readouterr().out
    assert "flag --max-num-seqs\n  table: 0.33.0 lacks it (versions <0.12.0;" in out
    assert "  wheel: has it (vllm/engine/arg_utils.py)" in out
    agreeing = table({"kind": "flag", "name": "--max-num-seqs", "versions": ">=0.12.0"})
    monkeypatch.setattr(contracts, "load", lambda: agreeing)
    assert contract_diff.main([str(FIXTURES / "vllm-0.33.0")]) == 0
    assert "rows: 1 checked, 0 differ, 0 not checkable" in capsys.readouterr().out
    # an option whose nargs the table says otherwise than the wheel's parser is a difference too
    held = {**contracts.load().arity("vllm"), "--max-num-seqs": "+"}
    del held["--cudagraph-capture-sizes"]
    monkeypatch.setattr(contracts, "load", lambda: table({"kind": "flag", "name": "--max-num-seqs",
                                                          "versions": ">=0.12.0"}, arity=held))
    assert contract_diff.main([str(FIXTURES / "vllm-0.33.0")]) == 1
    out = capsys.readouterr().out
    assert "  --cudagraph-capture-sizes: table one value, wheel +\n" in out
    assert "  --max-num-seqs: table +, wheel one value\n" in out
    (tmp_path / "not-a-wheel.whl").write_text("text")
    assert contract_diff.main([str(tmp_path / "not-a-wheel.whl")]) == 2
    assert "neither a wheel (zip) nor a directory" in capsys.readouterr().err


def test_a_wheel_reads_as_its_unpacked_directory(tmp_path: Path) -> None:
    """The zip path and the directory path give the same answers (the fixtures are a directory)."""
    wheel = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in sorted((FIXTURES / "vllm-0.33.0").rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(FIXTURES / "vllm-0.33.0").as_posix())
    zipped, unpacked = vllm_wheel.open_release(wheel), release("0.33.0")
    assert vllm_wheel.serve_options(zipped) == vllm_wheel.serve_options(unpacked)
    assert vllm_wheel.metric_names(zipped) == vllm_wheel.metric_names(unpacked)


def test_a_directory_without_vllm_metadata_is_refused(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "vllm-0.33.0" / "vllm", tmp_path / "vllm")
    with pytest.raises(WheelReadError, match="expected one"):
        vllm_wheel.open_release(tmp_path)
    (tmp_path / "other-1.0.dist-info").mkdir()
    (tmp_path / "other-1.0.dist-info" / "METADATA").write_text("Name: other\nVersion: 1.0\n")
    with pytest.raises(WheelReadError, match="not a vLLM release"):
        vllm_wheel.open_release(tmp_path)


def test_every_flag_and_variable_the_tool_renders_is_one_the_target_release_has() -> None:
    """The table's target (what the tool renders for while a host's version is unknown) against its own
    wheel: each rendered command line's module exists and each of its options is a serve option; each
    VLLM_* variable of the golden environment files is a key of its envs.py."""
    target = contracts.load().target("vllm")
    assert (FIXTURES / f"vllm-{target}").is_dir(), f"no fixture of the target {target}: add its wheel's files"
    read = release(target)
    options = vllm_wheel.serve_options(read).options
    variables = vllm_wheel.environment_variables(read)
    lines = rendered_lines()
    assert len(lines) > 30
    unknown = {}
    for case, argv in lines.items():
        start = argv.index("-m")
        assert vllm_wheel.module_path(read, argv[start + 1]), (case, argv[start + 1])
        flags = [word.split("=")[0] for word in argv[start + 2:] if word.startswith("-")]
        unknown.update({f"{case}: {flag}": target for flag in flags if flag not in options})
    rendered = {line.split("=")[0] for path in GOLDEN.glob("*/vllm.env") for line in path.read_text().splitlines()
                if line.startswith("VLLM_")}
    assert rendered, "no VLLM_ variable in the golden environment files"
    unknown.update({f"env {name}": target for name in rendered if name not in variables})
    assert not unknown, sorted(unknown)
