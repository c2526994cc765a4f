"""Starts llama-benchy (`python -m provision.benchlaunch ARGS`) with the server's API key taken from the
environment, never from argv: any user's `ps` shows a process's argv, its environment only to its owner.
benchrun starts it; the key is appended to llama-benchy's own arguments inside this process."""
from __future__ import annotations

import os
import sys

KEY_VARIABLE = "PROVISION_BENCH_API_KEY"


def main() -> None:
    key = os.environ.pop(KEY_VARIABLE, None)
    sys.argv = ["llama-benchy", *sys.argv[1:], *(["--api-key", key] if key else [])]
    from llama_benchy.__main__ import main as llama_benchy

    llama_benchy()


if __name__ == "__main__":
    main()
