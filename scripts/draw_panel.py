"""Draw one panel of a shipped dashboard (provision/dashboards/) from a Prometheus's data, as Grafana would
plot it: the panel's queries over a time range (Prometheus's /api/v1/query_range), one line per series,
with matplotlib. For the documentation's pictures, where Grafana itself cannot run.

    python3 scripts/draw_panel.py --prometheus http://10.77.0.12:9090 --dashboard endpoint \\
        --panel "Requests per replica" --minutes 15 --out docs/img/endpoint-requests-per-replica.png

Exit codes: 0 drawn; 1 Prometheus refused a query or returned no series; 2 bad usage (an unknown dashboard
or panel: the known ones are listed).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from provision import dashboards


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=60) as answer:
        data = json.load(answer)
    if data.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {data}")
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def series_name(metric: dict[str, str], legend: str) -> str:
    """The series' legend: the panel's legendFormat with its {{label}}s filled, else its labels."""
    if legend:
        for key, value in metric.items():
            legend = legend.replace("{{" + key + "}}", value).replace("{{ " + key + " }}", value)
        return legend
    return ", ".join(f"{k}={v}" for k, v in sorted(metric.items()) if k != "__name__") or "value"


def panel_of(name: str, title: str) -> dict[str, Any]:
    board = dashboards.load(name)
    panels = [panel for row in board.get("panels", []) for panel in (row, *row.get("panels", []))]
    for panel in panels:
        if panel.get("title") == title:
            return panel
    known = ", ".join(repr(panel.get("title")) for panel in panels if panel.get("targets"))
    raise SystemExit(f"error: dashboard {name} has no panel {title!r} (it has: {known})")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True, help="Prometheus's address, e.g. http://10.77.0.12:9090")
    parser.add_argument("--dashboard", required=True, help=f"one of: {', '.join(dashboards.names())}")
    parser.add_argument("--panel", required=True, help="the panel's title, as the dashboard shows it")
    parser.add_argument("--minutes", type=float, default=15, help="the time range, ending now (default 15)")
    parser.add_argument("--rate-interval", default="1m",
                        help="what $__rate_interval stands for (default 1m; Grafana's is about 4 scrape intervals)")
    parser.add_argument("--out", required=True, type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    if args.dashboard not in dashboards.names():
        print(f"error: no dashboard {args.dashboard!r} (shipped: {', '.join(dashboards.names())})", file=sys.stderr)
        return 2
    try:
        panel = panel_of(args.dashboard, args.panel)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = time.time()
    start = end - args.minutes * 60
    step = max(1.0, args.minutes * 60 / 600)
    figure, axes = plt.subplots(figsize=(9, 3.6))
    drawn = 0
    for target in panel.get("targets", []):
        expr = dashboards.expand(target["expr"], rate_interval=args.rate_interval)
        for series in query_range(args.prometheus, expr, start, end, step):
            points = [(float(t) - end, float(v)) for t, v in series["values"]]
            axes.plot([p[0] / 60 for p in points], [p[1] for p in points],
                      label=series_name(series["metric"], target.get("legendFormat", "")))
            drawn += 1
    if not drawn:
        print(f"error: no series for panel {args.panel!r} in the last {args.minutes:g} minutes", file=sys.stderr)
        return 1
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    axes.set_title(f"{args.panel} ({args.dashboard} dashboard)")
    axes.set_xlabel("minutes before the picture was drawn")
    axes.set_ylabel(unit)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", loc="upper left")
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=110)
    print(f"{args.out}: {drawn} series of {args.panel!r} from {args.prometheus}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
