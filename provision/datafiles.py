"""The tool's own YAML data (beside the code: engine contracts, known issues, profiles, rules), read
with libyaml's safe loader where PyYAML was built with it, as its wheels are: the pure-Python loader
took a third of a second of every run for these files. The same safe subset of YAML either way."""
from __future__ import annotations

from typing import Any

import yaml

SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str) -> Any:
    return yaml.load(text, Loader=SAFE_LOADER)  # a safe loader, C or Python
