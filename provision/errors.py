"""The exception tree: every error the tool raises on purpose. Each carries the evidence a user needs to act.

    ProvisionError
    ├── InventoryError (also ValueError)   bad inventory or usage: exit code 2, nothing contacted
    │   ├── OutputExists                   starter.py: init's file is there already; init never overwrites
    │   ├── TuneError                      tune: a space, workload or kept-trials file that cannot be used
    │   ├── RecipeError                    recipes/: a recipe (ours or Spark Arena's) that cannot be read or used
    │   └── BenchProfileError              benchprofile.py: a published benchmark profile that cannot be run here
    ├── ProfileError (also ValueError)     a hardware profile file that does not validate
    ├── KnownIssueError (also ValueError)  an entry of the known-issues file that does not validate
    ├── ContractError (also ValueError)    a row of the engine contracts table that does not validate
    ├── WheelReadError (also ValueError)   vllm_wheel.py: a file that is not a vLLM release it can read
    ├── RenderError (also ValueError)      render.py: a unit or environment file cannot be rendered
    ├── AffinityError (also ValueError)    affinity.py: the cpu_affinity policy cannot be met on this CPU
    ├── KvError (also ValueError)          kvcache.py: config.json lacks what the KV cache is computed from
    ├── UnreachableHost                    SSH could not connect or authenticate, or the link was lost
    │   └── HostKeyError                   unknown or changed host key: refused, with the command to accept it
    ├── CommandFailed                      a remote command ran and failed; carries the Result
    ├── ParseError (also ValueError)       a fact's output could not be understood; carries the output
    ├── WheelhouseError                    venv.py: the venv's wheels could not be resolved on the controller
    ├── BuildError                         build.py: a source could not be built into a wheel on its host
    ├── WeightsError                       weights.py: the hub refused, or a fetch or verification failed
    │   └── HubUnreachable                 the hub gave no answer of its own (network, DNS, proxy, offline)
    ├── RelayError                         relay.py: a relay server could not start, or a program ended unanswered
    ├── ForeignDirectory                   plan.py: a directory the host should have belongs to someone else
    ├── ApplyFailed                        ops.py: a step of the plan failed on the host (the step named)
    ├── NotReady                           server.py: the server did not answer /health and a completion
    ├── RollStopped                        rolling.py: deploy stopped its roll at this host (why, and what came back)
    └── LabError                           the lab could not be set up or torn down
        └── HubError                       lab/hub.py: the lab hub refuses a request (an HTTP status and code)

tests/test_errors.py holds this drawing to the classes (their bases, and that none is defined elsewhere).
An error that translates another keeps it as its cause (`raise ... from exc`): the one-line message
says what to do, and `--verbose` shows the cause beneath it.

The programs that run on hosts (provision/host/) report their failures in their JSON answers, which the
controller turns into these; their own exceptions (StepFailed, ...) never leave the host, which has no
copy of this package.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from provision.runner import Result


_LINE_BREAKS = str.maketrans({"\n": "\\n", "\r": "\\r", "\x85": "\\x85", "\u2028": "\\u2028",
                              "\u2029": "\\u2029"})


def clip(text: str, limit: int = 80) -> str:
    """At most `limit` characters of `text`, on one line: errors quote what a file holds (a YAML key
    may hold a line break), and a file may be hostile."""
    text = text.translate(_LINE_BREAKS)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class ProvisionError(Exception):
    """Base of every error the tool raises on purpose."""


class InventoryError(ProvisionError, ValueError):
    """The inventory (or a command-line override) is wrong. Raised before any host is contacted."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        entity: str | None = None,
        key: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.entity = entity
        self.key = key
        super().__init__(self.describe())

    def describe(self) -> str:
        where = self.file or "inventory"
        if self.line is not None:
            where += f":{self.line}"
        parts = [where]
        if self.entity:
            parts.append(clip(self.entity))
        if self.key:
            parts.append(f"key '{clip(self.key)}'")
        return ": ".join(parts) + ": " + self.message


class OutputExists(InventoryError):
    """The file is there already: init never overwrites (exit 2, nothing changed)."""


class TuneError(InventoryError):
    """A space or workload file that cannot be used (exit 2: nothing was changed)."""


class RecipeError(InventoryError):
    """A recipe file (shipped, a user's, or one of Spark Arena's registry) that cannot be read, or whose
    settings do not validate as inventory settings, or that has no meaning here (exit 2)."""


class BenchProfileError(InventoryError):
    """A benchmark profile file (Spark Arena's, or a user's) that cannot be read, names a tool this one
    does not run, or asks nothing the server can serve (exit 2)."""


class ProfileError(ProvisionError, ValueError):
    """A hardware profile file is malformed (a defect of the profile data, shipped or user-supplied)."""


class KnownIssueError(ProvisionError, ValueError):
    """An entry of the known-issues data (provision/known_issues.yaml) is malformed; names the entry."""


class ContractError(ProvisionError, ValueError):
    """A row of the engine contracts table (provision/engine_contracts.yaml) is malformed; names the row."""


class WheelReadError(ProvisionError, ValueError):
    """A wheel or directory given as a vLLM release is not one the static reader can read (no METADATA
    naming vllm, no envs.py, a serve parser it cannot find); names the file."""


class RenderError(ProvisionError, ValueError):
    """A template or value could not be rendered; names the template and line."""


class AffinityError(ProvisionError, ValueError):
    """The policy cannot be met on this topology (e.g. ccd:5 on a 2-CCD part)."""


class KvError(ProvisionError, ValueError):
    """config.json lacks what the KV cache is computed from."""


def about(host: str, text: str) -> str:
    """`text` about `host`, the host named once: 'cpu-1: …', never 'cpu-1: cpu-1: …'."""
    return text if text.startswith(f"{host}:") else f"{host}: {text}"


def error_text(error: BaseException) -> str:
    """An error as one line for a report: the tool's own errors as they say it, anything else named a
    defect of the tool."""
    if isinstance(error, ProvisionError):
        return str(error)
    return f"internal error ({type(error).__name__}): {error}"  # a defect of the tool: say so


def causes(error: BaseException) -> list[str]:
    """What `error` was raised from (`raise ... from cause`), nearest first, one line each:
    ['OSError: [Errno 111] Connection refused']. --verbose logs them beneath the error's own line;
    the line itself never carries them."""
    said: list[str] = []
    cause = error.__cause__
    while cause is not None and len(said) < 8:
        said.append(f"{type(cause).__name__}: {clip(str(cause), 300)}")
        cause = cause.__cause__
    return said


class UnreachableHost(ProvisionError):
    """The host could not be reached or logged into."""

    def __init__(self, host: str, reason: str) -> None:
        self.host = host
        # A reason taken from another error about this host already names it (and says "unreachable").
        self.reason = reason.removeprefix(f"{host}: ").removeprefix("unreachable: ")
        super().__init__(f"{host}: unreachable: {self.reason}")


class HostKeyError(UnreachableHost):
    """The host presented an unknown or a changed key; strict checking refuses it."""


class CommandFailed(ProvisionError):
    """A remote command exited non-zero (or timed out). `result` holds its exit code and output."""

    def __init__(self, host: str, step: str, result: Result) -> None:
        self.host = host
        self.step = step
        self.result = result
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        detail = " | ".join(tail) if tail else "no output"
        super().__init__(f"{host}: {step} failed (exit {result.exited}): {detail}")


class ParseError(ProvisionError, ValueError):
    """A fact's command output did not have the expected shape."""

    def __init__(self, fact: str, message: str, output: str = "") -> None:
        self.fact = fact
        self.output = output
        super().__init__(f"{fact}: {message}")


class WheelhouseError(ProvisionError):
    """The wheels could not be resolved on the controller (pip's own words included)."""


class BuildError(ProvisionError):
    """The source could not be read, sent or built (the compiler's last words included)."""


class WeightsError(ProvisionError):
    """The hub refused or does not know what the inventory asks for, or a transfer failed."""


class HubUnreachable(WeightsError):
    """No answer from the hub itself: no connection (DNS, refused, a timeout), offline mode, or a proxy
    or gateway's own error status. Says nothing of the model, its revision or the token."""


class RelayError(ProvisionError):
    """A relay server could not start, or a host program ended without an answer."""


class ForeignDirectory(ProvisionError):
    """A directory the host should have exists and belongs to someone else: the plan refuses to take
    it over (a chown would hand whatever it holds, /etc say, to the service user)."""


class ApplyFailed(ProvisionError):
    """A step failed on the host; the steps before it stay applied, the rest did not run."""

    def __init__(self, host: str, step: str, error: str, done: int) -> None:
        self.host, self.step, self.error, self.done = host, step, error, done
        super().__init__(f"{host}: {step} failed after {done} step(s): {error}")


class NotReady(ProvisionError):
    """The server did not become ready (health and a completion) in time."""


class RollStopped(ProvisionError):
    """A host was not ready after its change: rolled back, and the roll went no further."""


class LabError(ProvisionError):
    """The lab could not be brought up or down; the message says what to run to fix it."""


class HubError(LabError):
    """The lab hub refuses a request: `status` is the HTTP status, `code` the hub's error code
    (RepoNotFound, GatedRepo, ...). Raised and answered inside the hub's server, as the real hub
    answers; a client sees the HTTP answer, never this."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
