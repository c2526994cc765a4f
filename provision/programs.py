"""Host programs that report as they go: JSON lines on stdout, events while they work and one
{"event": "result", ...} at the end (hostweights, hostbuild, hostserve)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from provision.remote import Result, Runner


def source(files: Sequence[Path], call: str, spec: Any) -> str:
    """The programs' text with the call that runs them on `spec`: the whole stdin of one execution."""
    text = "\n".join(path.read_text(encoding="utf-8") for path in files)
    return text + f"\n{call}(json.loads({json.dumps(spec)!r}))\n"


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
