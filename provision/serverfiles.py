"""Files a server flag names (a chat template, a reasoning- or tool-parser plugin), given from the
controller and placed on the host: the `server_files` setting.

A container recipe's mod drops such a file into the image (Spark Arena's `mods/nemotron-nano` fetches
nano_v3_reasoning_parser.py into the container's working directory, and its command says
`--reasoning-parser-plugin nano_v3_reasoning_parser.py`); on bare metal no such file exists, and the
server does not start. So the setting maps a flag to a local file on the controller:

    server_files: {--reasoning-parser-plugin: ./nano_v3_reasoning_parser.py}   # relative: the inventory file's folder

which the plan copies to FILES_DIR/<service>/<name> (root's, mode 0644; the host's own server: "server"),
compared by content like every managed file, and the server's command gets `FLAG HOSTPATH` (in place of
the same flag in server_flags or extra_args). A value `image:PATH` is a file an imported recipe needs,
PATH inside its container image: a reference that must be given a local file before the recipe is applied
(recipes/applying.py) and before anything is rendered (render.py).

Pure, except `read_local`: the one read of the controller's file, bounded (MAX_BYTES), at render time.
"""
from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from pathlib import Path

# The flags of the engines' servers that take a file (the reader of Spark Arena's recipes carries a
# relative value of one of these as a file inside the image):
#   vLLM 0.33.0 (its parser's options: tests/fixtures/wheels/vllm-0.33.0.parser-options.json):
#     --chat-template (a file, or a template on one line), --reasoning-parser-plugin, --tool-parser-plugin;
#   SGLang 0.5.23 (sglang/srt/arg_groups/fields/serving.py): --chat-template, --completion-template
#     (a built-in name or a file);
#   llama.cpp b11434 (llama-server --help): --chat-template-file.
FILE_FLAGS: Mapping[str, str] = {
    "--chat-template": "a chat template (Jinja)",
    "--reasoning-parser-plugin": "a reasoning-parser plugin (Python)",
    "--tool-parser-plugin": "a tool-parser plugin (Python)",
    "--completion-template": "a completion template",
    "--chat-template-file": "a chat template (Jinja)",
}
IMAGE = "image:"  # the value of a file an imported recipe needs: image:PATH, PATH inside its image
FILES_DIR = "/etc/provision/files"
HOST_NAME = "server"  # the folder of a host's own server (a host without services)
MAX_BYTES = 1024 * 1024  # a template or a plugin is a few KiB; a bigger file is not one


def is_image(value: str) -> bool:
    return value.startswith(IMAGE)


def image_path(value: str) -> str:
    """The path inside the image an `image:PATH` value names."""
    return value[len(IMAGE):]


def needed(files: Mapping[str, str]) -> dict[str, str]:
    """{flag: path inside the image} of the files not given yet."""
    return {flag: image_path(value) for flag, value in files.items() if is_image(value)}


def host_dir(service: str | None) -> str:
    """Where one server's files live on its host: FILES_DIR/<service>, or FILES_DIR/server."""
    return f"{FILES_DIR}/{service or HOST_NAME}"


def host_paths(files: Mapping[str, str], service: str | None) -> dict[str, str]:
    """{flag: the path on the host} of the files given (an image reference has none)."""
    folder = host_dir(service)
    return {flag: f"{folder}/{posixpath.basename(value)}" for flag, value in files.items() if not is_image(value)}


def clashes(files: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(name, flag, flag) for two given files of one name: they would land on one host path."""
    seen: dict[str, str] = {}
    found = []
    for flag, value in files.items():
        if is_image(value):
            continue
        name = posixpath.basename(value)
        if name in seen:
            found.append((name, seen[name], flag))
        seen[name] = flag
    return found


def check_local(path: Path) -> str | None:
    """Why a local file cannot be given (None: it can): missing, not a regular file, over MAX_BYTES."""
    try:
        if not path.is_file():
            return f"{path}: no such file on this machine" if not path.exists() else f"{path}: not a regular file"
        size = path.stat().st_size
    except OSError as exc:
        return f"{path}: cannot read ({exc.strerror or exc})"
    if size > MAX_BYTES:
        return f"{path}: {size} bytes, over {MAX_BYTES // 1024} KiB (a template or a plugin is a few KiB)"
    return None


def read_local(path: str) -> str:
    """The local file's text (UTF-8), read no further than MAX_BYTES; OSError or ValueError say why not."""
    with open(path, "rb") as stream:
        data = stream.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{path}: over {MAX_BYTES // 1024} KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (a template or a plugin is text)") from exc


def set_hint(flags: Iterable[str]) -> str:
    """The --set that gives each flag's file: --set server_files='{FLAG: LOCAL_FILE, ...}'."""
    body = ", ".join(f"{flag}: LOCAL_FILE" for flag in flags)
    return f"--set server_files='{{{body}}}'"
