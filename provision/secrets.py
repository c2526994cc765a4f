"""Secrets: the hub token and the vLLM API key.

They come from the inventory's `secrets:` file (YAML, mode 0600: nobody else may read it) or, when the
inventory names none, from HF_TOKEN / VLLM_API_KEY in the controller's environment. Each is registered
for masking the moment it is read, so no log line or report can carry it; it reaches a host only inside
a program's stdin or a 0600 file, never in a command line.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml

from provision.errors import InventoryError
from provision.remote import register_secret

ENVIRONMENT = {"hf_token": "HF_TOKEN", "vllm_api_key": "VLLM_API_KEY"}


@dataclass(frozen=True)
class Secrets:
    hf_token: str | None = None
    vllm_api_key: str | None = None

    def __repr__(self) -> str:  # never print a secret by accident
        return (f"Secrets(hf_token={'set' if self.hf_token else None}, "
                f"vllm_api_key={'set' if self.vllm_api_key else None})")


def load(path: str | None) -> Secrets:
    """The secrets file named by the inventory, else the controller's environment."""
    values = _read_file(Path(path)) if path else {
        key: os.environ[name] for key, name in ENVIRONMENT.items() if os.environ.get(name)}
    for value in values.values():
        register_secret(value)
    return Secrets(**values)


def _read_file(path: Path) -> dict[str, str]:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise InventoryError("the secrets file does not exist", file=str(path), key="secrets") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InventoryError(f"the secrets file is mode {stat.S_IMODE(info.st_mode):04o}: others may read it; "
                             f"run `chmod 600 {path}`", file=str(path), key="secrets")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        # The parser's message may quote the file's text: name the problem's place only.
        where = getattr(exc, "problem_mark", None)
        line = f" near line {where.line + 1}" if where else ""
        raise InventoryError(f"cannot read the secrets file{line}", file=str(path), key="secrets") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InventoryError("the secrets file must be a mapping (hf_token: ..., vllm_api_key: ...)",
                             file=str(path), key="secrets")
    unknown = sorted(str(key) for key in data if key not in ENVIRONMENT)
    if unknown:
        raise InventoryError(f"unknown secret(s) {', '.join(unknown)} (known: {', '.join(ENVIRONMENT)})",
                             file=str(path), key="secrets")
    values = {}
    for key, value in data.items():
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip() or "\n" in value:
            raise InventoryError(f"'{key}' must be a one-line string", file=str(path), key="secrets")
        values[str(key)] = value.strip()
    return values
