"""The tool's own YAML data (beside the code: engine contracts, known issues, profiles, rules), read
with libyaml's safe loader where PyYAML was built with it, as its wheels are: the pure-Python loader
took a third of a second of every run for these files. The same safe subset of YAML either way."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import yaml

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable
    from pathlib import Path

    from provision.errors import InventoryError

SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str) -> Any:
    return yaml.load(text, Loader=SAFE_LOADER)  # a safe loader, C or Python


def text_rows(name: str, key: str, keys: tuple[str, ...], noun: str) -> list[dict[str, str]]:
    """The rows of the package's data file `name` under `key`, each holding exactly `keys`, every one as
    text; ContractError names the file and the row (`noun` N) that is not so."""
    from importlib import resources

    from provision.errors import ContractError

    data = load(resources.files("provision").joinpath(name).read_text(encoding="utf-8"))
    rows = data.get(key) if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ContractError(f"provision/{name}: expected a mapping with a list of {key}")
    for index, row in enumerate(rows, start=1):
        if not isinstance(row, dict) or sorted(row) != sorted(keys) or not all(
                isinstance(row[field], str) and row[field].strip() for field in keys):
            raise ContractError(f"provision/{name}: {noun} {index}: needs each of {', '.join(keys)} as text")
    return cast("list[dict[str, str]]", rows)


def read_bounded(path: Path | Traversable, limit: int, error: type[InventoryError], what: str) -> bytes:
    """A user's data file (a recipe, a benchmark profile), read no further than `limit` bytes; `error`
    (exit 2) names the file where it cannot be read or is larger than `what` ever is."""
    from provision.errors import clip

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read: {clip(str(exc))}", file=str(path)) from exc
    if len(data) > limit:
        raise error(f"larger than {limit // 1024} KiB: not {what}", file=str(path))
    return data


def write_whole(path: Path, text: str) -> None:
    """`text` as the whole of `path`, its folder made: written beside it and renamed over it, so a
    reader (the inventory, a resumed run) finds the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)
