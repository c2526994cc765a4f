"""Shipping the host programs (provision/host/) and reading what they report.

Every host program travels the same way: ship() joins common.py and the named programs into one text,
drops their `from provision.host.X import` lines (what they name is earlier in the same text) and their
`from __future__ import annotations` (one goes first instead, where Python accepts it), and
appends the call that runs it on a spec; that text is the stdin of one `python3 -` on the host. Programs
that report as they go print JSON lines: events while they work and one {"event": "result", ...} at the
end (weights, build, serve), read by run()."""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the fact recorder ships the probe on bare GPU hosts, which have no Fabric
    from provision.runner import Result, Runner

_OWN_IMPORT = re.compile(r"^from provision\.host\.\w+ import (\([^)]*\)|[^\n]*)\n", re.MULTILINE)
# A __future__ import must open the text, so it cannot stay in a part that follows another. The probe
# and common.py have none: they run on any python3 >= 3.6, which has no such feature.
_FUTURE = "from __future__ import annotations\n"
_FUTURE_LINE = re.compile(r"^from __future__ import annotations\n", re.MULTILINE)


def host_source(name: str) -> str:
    """One host program's text, read from the installed package: 'probe' -> provision/host/probe.py."""
    return resources.files("provision.host").joinpath(f"{name}.py").read_text(encoding="utf-8")


def ship(names: Sequence[str], call: str, spec: Any) -> str:
    """common.py, then `names` in order, then `call(SPEC)`: the whole stdin of one remote execution.
    The spec travels as JSON inside the text (stdin), never in argv: it may hold secrets."""
    sources = [host_source(name) for name in ("common", *names)]
    future = _FUTURE if any(_FUTURE_LINE.search(text) for text in sources) else ""
    parts = [_FUTURE_LINE.sub("", _OWN_IMPORT.sub("", text)) for text in sources]
    return future + "\n".join(parts) + f"\n{call}(json.loads({json.dumps(spec)!r}))\n"


def run(runner: Runner, program: str, timeout: float, on_event: Callable[[dict[str, Any]], None],
        python: str = "python3") -> tuple[dict[str, Any], Result]:
    """Run a program on the host; each event goes to on_event as it arrives. Returns the result
    event ({} if the program ended without one: the caller says what that means) and the Result."""
    answer: dict[str, Any] = {}

    def line(text: str) -> None:
        try:
            event = json.loads(text)
        except json.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        if event.get("event") == "result":
            answer.update(event)
        else:
            on_event(event)

    done = runner.run([python, "-"], stdin=program, timeout=timeout, on_line=line)
    return answer, done


def tail(done: Result) -> str:
    return " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
