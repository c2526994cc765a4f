"""Secrets: the hub token and the vLLM API key.

Each comes from HF_TOKEN / VLLM_API_KEY in the controller's environment when set there (what people expect
of HF_TOKEN, and how a CI job or a one-off run overrides a file), else from the inventory's `secrets:`
file (YAML, mode 0600: nobody else may read it; checked whenever the inventory names it). Which source
gave each one is kept (`sources`) so the tool can say it, never the value. Each is registered
for masking the moment it is read, so no log line or report can carry it; it reaches a host only inside
a program's stdin or a 0600 file, never in a command line.
"""
from __future__ import annotations

import logging
import os
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from provision.errors import InventoryError

ENVIRONMENT = {"hf_token": "HF_TOKEN", "api_key": "VLLM_API_KEY",
               # The private key a TensorRT-LLM cluster's head starts ranks on its workers with (mpirun over SSH).
               "mpi_ssh_key": "PROVISION_MPI_SSH_KEY"}


MULTI_LINE = ("mpi_ssh_key",)
# How a source is said when a secret came from the inventory's file: "the secrets file PATH".
FILE_SOURCE = "the secrets file "
# Secrets renamed when they stopped being vLLM's alone: still read, under the new name, each use said
# in one line naming the key to write instead.
RENAMED = {"vllm_api_key": "api_key"}

# Masking: every secret read is registered here, and whatever the tool logs or prints of a host's
# output passes through mask(). Kept with the secrets, not with SSH: a task that never connects
# (a report, a journal read locally) masks too, without importing paramiko.
_SECRETS: set[str] = set()
MASK = "*****"


def register_secret(value: str | None) -> None:
    """From now on `mask()` hides `value` wherever it appears. Short values would mask noise."""
    if value and len(value) >= 4:
        _SECRETS.add(value)


def mask(text: str) -> str:
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


class MaskingFilter(logging.Filter):
    """Installed on every handler of the 'provision' logger: no log line carries a registered secret."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = mask(record.getMessage())
        record.args = None
        return True


@dataclass(frozen=True)
class Secrets:
    hf_token: str | None = None
    api_key: str | None = None
    mpi_ssh_key: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict)  # {"hf_token": "environment (HF_TOKEN)"}

    def __repr__(self) -> str:  # never print a secret by accident
        return (f"Secrets(hf_token={'set' if self.hf_token else None}, "
                f"api_key={'set' if self.api_key else None}, "
                f"mpi_ssh_key={'set' if self.mpi_ssh_key else None})")

    def describe(self) -> str | None:
        """'hf_token from the environment (HF_TOKEN); api_key from the secrets file F', or None."""
        said = [f"{key} from {source}" for key, source in self.sources.items()]
        return "; ".join(said) or None


def load(path: str | None) -> Secrets:
    """Each secret from the controller's environment when set there, else from the inventory's file."""
    from_file = _read_file(Path(path)) if path else {}
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    for key, name in ENVIRONMENT.items():
        if os.environ.get(name, "").strip():
            values[key], sources[key] = os.environ[name].strip(), f"the environment ({name})"
        elif key in from_file:
            values[key], sources[key] = from_file[key], f"{FILE_SOURCE}{path}"
    for value in values.values():
        register_secret(value)
        for line in value.splitlines():  # a key's lines are masked one by one too
            if len(line.strip()) >= 16 and "PRIVATE KEY" not in line:
                register_secret(line.strip())
    return Secrets(**values, sources=sources)


def _current_name(key: str, data: Mapping[str, object], path: Path) -> str:
    """The secret's name now: a renamed one's new name (both given is an error: which one is meant?)."""
    new = RENAMED.get(key)
    if new is None:
        return key
    if new in data:
        raise InventoryError(f"{key} is the old name of {new}, which is given too: keep {new} alone",
                             file=str(path), key="secrets")
    logging.getLogger("provision.secrets").warning("%s: %s is deprecated: write %s (read as %s this time)",
                                                    path, key, new, new)
    return new


def _read_file(path: Path) -> dict[str, str]:
    try:
        info = path.stat()
    except FileNotFoundError as exc:
        raise InventoryError("the secrets file does not exist", file=str(path), key="secrets") from exc
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InventoryError(f"the secrets file is mode {stat.S_IMODE(info.st_mode):04o}: others may read it; "
                             f"run `chmod 600 {path}`", file=str(path), key="secrets")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        # The parser's message may quote the file's text: name the problem's place only. Not kept as the
        # cause either (from None): --verbose would print that text, secrets not yet registered for masking.
        where = getattr(exc, "problem_mark", None)
        line = f" near line {where.line + 1}" if where else ""
        raise InventoryError(f"cannot read the secrets file{line}", file=str(path), key="secrets") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InventoryError("the secrets file must be a mapping (hf_token: ..., api_key: ...)",
                             file=str(path), key="secrets")
    data = {_current_name(str(key), data, path): value for key, value in data.items()}
    unknown = sorted(str(key) for key in data if key not in ENVIRONMENT)
    if unknown:
        raise InventoryError(f"unknown secret(s) {', '.join(unknown)} (known: {', '.join(ENVIRONMENT)})",
                             file=str(path), key="secrets")
    values = {}
    for key, value in data.items():
        if value is None:
            continue
        if key in MULTI_LINE:
            if not isinstance(value, str) or "PRIVATE KEY-----" not in value:
                raise InventoryError(f"'{key}' must be an OpenSSH private key (a YAML block: |)",
                                     file=str(path), key="secrets")
        elif not isinstance(value, str) or not value.strip() or "\n" in value:
            raise InventoryError(f"'{key}' must be a one-line string", file=str(path), key="secrets")
        values[str(key)] = value.strip()
    return values


def file_of(source: str | None) -> str | None:
    """The secrets file a source names ("the secrets file PATH" -> PATH), None for the environment."""
    return source[len(FILE_SOURCE):] if source and source.startswith(FILE_SOURCE) else None


def bearer_header(path: str) -> str:
    """The HTTP header that carries the file's api_key: what `python -m provision.secrets header FILE`
    writes for `curl -H @-` to read on its stdin, so the key is in no command line and on no screen."""
    key = _read_file(Path(path)).get("api_key")
    if key is None:
        raise InventoryError("the secrets file has no api_key", file=path, key="secrets")
    return f"Authorization: Bearer {key}"


def main(argv: Sequence[str]) -> int:
    """`python -m provision.secrets header FILE`: the api_key's header line on stdout (exit 0), or why
    not on stderr (exit 2). The deploy's curl hint pipes it into `curl -H @-`."""
    if len(argv) != 2 or argv[0] != "header":
        print("usage: python -m provision.secrets header SECRETS_FILE", file=sys.stderr)
        return 2
    try:
        print(bearer_header(argv[1]))
    except InventoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
