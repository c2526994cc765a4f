"""Tables for people, printed where there is no terminal (a CI log, a pipe, a file): whole, never cut at
some right edge or wrapped inside a cell."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from provision import report, rolling, secrets

# A lab.status row as a host that replays nothing of this machine's facts shows it, and a long address:
# far wider than the 160 columns piped output used to get.
NOT_REPLAYED = "uname, os_release, meminfo, cpuinfo, lscpu, lscpu_cpus, modules, proc_devices"
ROWS = [{"host": f"bench-{n:02d}", "address": f"10.231.77.{40 + n}", "profile": "rtx5090",
         "replays": "rtx5090x1-kernel68-proprietary", "not replayed (this machine's)": NOT_REPLAYED,
         "process": "running", "sshd": "answers", "note": "a note " * 12} for n in range(1, 4)]


def test_a_table_piped_is_printed_whole_on_one_line_per_row(capsys: pytest.CaptureFixture[str]) -> None:
    out = report.console()  # stdout is captured: not a terminal
    assert not out.is_terminal
    report.print_rows(ROWS, "lab hosts (inventory: /var/lib/provision-lab/inventory.yaml)", out)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("lab hosts (inventory: /var/lib/provision-lab/inventory.yaml)")
    body = [line for line in lines if line.startswith("│")]
    assert len(body) == 3  # one line per host: no cell wrapped onto a second line
    for row, line in zip(ROWS, body, strict=True):
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        assert cells == [str(value).strip() for value in row.values()]
    widths = {len(line) for line in lines[1:]}
    assert len(widths) == 1 and widths.pop() > 160  # as wide as the cells, not some terminal's width


def test_a_long_line_piped_is_not_wrapped(capsys: pytest.CaptureFixture[str]) -> None:
    line = "cpu-1: " + "the fix names every step " * 20
    report.console().print(line)
    assert capsys.readouterr().out == line + "\n"


# A rolled-back host's reason: one path far wider than the detail column of an 80-column table.
REASON = ("removed /etc/systemd/system/vllm.service.d/10-provision-generation-0042.conf and restored "
          "generation 41: not ready in 600 s (journal: torch.OutOfMemoryError: CUDA out of memory)")


def test_a_deploy_s_failure_reason_is_whole_at_a_fixed_width(capsys: pytest.CaptureFixture[str]) -> None:
    """A console of fixed width (a terminal's, or one given for a log) wraps the detail column; the
    reason is never cut with an ellipsis. Piped (report.console()), it is whole on one line."""
    outcomes = {"h200": rolling.Outcome("h200", "rolled back", detail=REASON), "ws-5090": rolling.Outcome("ws-5090")}
    result = rolling.Deployed(["h200", "ws-5090"], {}, outcomes, {}, {}, {}, 12.0, secrets.Secrets())
    log = io.StringIO()
    narrow = Console(file=log, width=80, highlight=False, markup=False)
    assert not narrow.is_terminal
    narrow.print(report.deployed_table(report.deployed_rows(result), result.seconds))
    body = [line for line in log.getvalue().splitlines() if line.startswith("│")]
    detail = [line.strip("│").split("│")[-1].strip() for line in body]
    assert "…" not in log.getvalue()
    assert "".join(detail).replace(" ", "") == REASON.replace(" ", "")
    report.print_deployed(result, json_=False)
    assert any(line.rstrip(" │").endswith(REASON) for line in capsys.readouterr().out.splitlines())


def test_what_hosts_errors_and_hints_say_prints_with_its_brackets(capsys: pytest.CaptureFixture[str]) -> None:
    """rich reads "[word ...]" as a style and drops it: a hint's YAML list (pip_extra_index_urls: [URL],
    [a, b]) vanished from the line that gave it. Only the report's own styles are markup now."""
    from provision import venv
    from provision.checks import Finding

    hint = venv.check_torch_variant(["torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl",
                                     "nvidia_cuda_runtime-13.0.96-py3-none-manylinux_2_27_x86_64.whl"], "cu128")
    assert hint is not None and "pip_extra_index_urls: [https://download.pytorch.org/whl/cu128]" in hint
    fix = "set model_files: [a, b] and build_cmake_args: [-DGGML_CUDA=ON]"
    failed = Finding("config.x", "blocker", "fail", "the [red] word is a host's own text", fix=fix)
    report.print_check(["ws-5090", "h200"], {"h200": [failed]}, {"ws-5090": RuntimeError(f"ws-5090: {hint}")},
                       report.console())
    out = capsys.readouterr().out
    assert f"ws-5090: {hint}" in out
    assert "[a, b]" in out and "[-DGGML_CUDA=ON]" in out and "the [red] word" in out and "FAIL" in out
    styled = report.styled(f"[bold]{report.plain('h[1]')}[/bold]: [red]{report.plain('[https://x]')}[/red]")
    assert styled.plain == "h[1]: [https://x]" and [span.style for span in styled.spans] == ["bold", "red"]
