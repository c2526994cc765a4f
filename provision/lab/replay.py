"""Replays recorded command outputs inside a lab host (copied there by the lab; runs on the host).

Installed as /usr/local/lib/provision-lab/replay.py with one small Python launcher per recorded
command in /usr/local/bin (ahead of /usr/bin on PATH). An invocation whose argv was recorded prints
the recorded output and exits with the recorded code; any other invocation runs the real command if
the host has one, else fails the way a missing tool does.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REAL_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


def main() -> None:
    name = os.path.basename(sys.argv[0])
    with open(os.path.join(HERE, "recording.json"), encoding="utf-8") as handle:
        recorded = json.load(handle)
    for entry in recorded:
        if os.path.basename(entry["argv"][0]) == name and entry["argv"][1:] == sys.argv[1:]:
            sys.stdout.write(entry["stdout"])
            sys.stderr.write(entry.get("stderr", ""))
            sys.exit(entry["exit"])
    for directory in REAL_DIRS:
        real = os.path.join(directory, name)
        if os.access(real, os.X_OK):
            os.execv(real, [real] + sys.argv[1:])
    sys.stderr.write(f"{name}: this invocation was not recorded for this host\n")
    sys.exit(127)
