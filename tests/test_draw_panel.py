"""scripts/draw_panel.py: which panel it draws, how a series is named, and a bad name as a usage error."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO


def draw_panel() -> ModuleType:
    spec = importlib.util.spec_from_file_location("draw_panel", REPO / "scripts" / "draw_panel.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["draw_panel"] = module
    spec.loader.exec_module(module)
    return module


def test_a_series_is_named_by_the_panel_s_legend_else_by_its_labels() -> None:
    module = draw_panel()
    metric = {"__name__": "haproxy_server_http_requests_total", "proxy": "lab-tiny-1", "server": "lab-llama-b"}
    assert module.series_name(metric, "{{proxy}} {{server}}") == "lab-tiny-1 lab-llama-b"
    assert module.series_name(metric, "") == "proxy=lab-tiny-1, server=lab-llama-b"


def test_the_panel_is_found_by_its_title_in_the_shipped_dashboard() -> None:
    panel = draw_panel().panel_of("endpoint", "Requests per Replica")
    assert any("haproxy_server" in target["expr"] for target in panel["targets"])


@pytest.mark.parametrize(("args", "words"), [
    (["--dashboard", "nope", "--panel", "x"], "no dashboard 'nope' (shipped: "),
    (["--dashboard", "endpoint", "--panel", "Nope"], "has no panel 'Nope' (it has: 'Requests'"),
])
def test_an_unknown_dashboard_or_panel_exits_2_naming_the_known_ones(
        args: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = draw_panel().main(["--prometheus", "http://127.0.0.1:9", *args, "--out", str(tmp_path / "x.png")])
    assert code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
