"""results.json -> a PNG of wall time against host count, one panel per scenario, one line per tool.

Run with benchmarks/.venv/bin/python (matplotlib lives there): python plot.py results.json plot.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

TITLES = {"first": "first provision", "noop": "no-op provision", "status": "cluster status"}


def main(source: str, target: str) -> None:
    with open(source) as handle:
        document = json.load(handle)
    results = document["results"]
    scenarios = [s for s in TITLES if any(r["scenario"] == s for r in results)]
    figure, axes = plt.subplots(1, len(scenarios), figsize=(5 * len(scenarios), 4.2), squeeze=False)
    for axis, scenario in zip(axes[0], scenarios):
        for tool in ("provision", "ansible", "pyinfra"):
            rows = sorted((r["hosts"], r["median"]) for r in results
                          if r["tool"] == tool and r["scenario"] == scenario)
            if rows:
                axis.plot([h for h, _ in rows], [m for _, m in rows], marker="o",
                          label="this tool" if tool == "provision" else tool)
        axis.set_title(TITLES[scenario])
        axis.set_xlabel("hosts")
        axis.set_ylabel("wall time, s (median)")
        axis.set_xscale("log", base=2)
        axis.set_xticks(sorted({r["hosts"] for r in results}))
        axis.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(f"{document['meta']['machine']} - {document['meta']['date']}")
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
