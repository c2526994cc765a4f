"""Record this machine's fact outputs verbatim, as a lab machine recording.

    python3 scripts/record_facts.py --name h200x1-driver580 --profile hopper --out FILE.json

Runs the same probe the tool sends over SSH (provision/host/probe.py with every Fact of
provision/facts.py), plus a plain `nvidia-smi` for people to read, and writes each command's argv,
exit code and output. The file is both a parser fixture and what a lab host replays.
Needs only the standard library and the repository (no Fabric), so it runs on bare GPU machines.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from provision import facts

EXTRA = {"nvidia_smi_table": ["nvidia-smi"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="after the hardware, e.g. h200x1-driver580")
    parser.add_argument("--profile", required=True, help="the hardware profile it plays")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    spec = facts.probe_spec(facts.FACTS, paths=["/"], timeout=30)
    spec["commands"].update(EXTRA)
    done = subprocess.run([sys.executable, "-"], input=facts.probe_program(spec), text=True,
                          capture_output=True, check=True)
    answer = json.loads(done.stdout)
    outputs = []
    for name, result in answer["results"].items():
        entry = {"fact": name}
        if name in spec["commands"]:
            entry["argv"] = spec["commands"][name]
        elif name in spec["trees"]:
            entry["tree"] = spec["trees"][name]
        else:
            entry["file"] = spec["files"][name]
        entry.update(result)
        outputs.append(entry)
    recording = {
        "name": args.name,
        "profile": args.profile,
        "provenance": f"recorded verbatim by scripts/record_facts.py on {datetime.date.today()}",
        "python": answer["python"],
        "outputs": outputs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(recording, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(outputs)} outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
