"""A GGUF file's header, read on the host by the probe: its scalar metadata (what config.json says of a
checkpoint: layers, heads, KV heads, context length, the architecture and file type), for the memory fit.

Standard library only (struct), python3 >= 3.6, like the probe it is shipped with. The format (v2 and
v3, little endian; https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): b"GGUF", uint32 version,
uint64 tensor count, uint64 key count, then per key a string (uint64 length, UTF-8 bytes), a uint32
value type and the value. Arrays (the tokenizer's 128k token strings, its merges) are walked past,
never kept; strings longer than MAX_GGUF_STRING (a chat template) are skipped too. The walk stops at
MAX_GGUF_BYTES or MAX_GGUF_KEYS and never raises on a garbled or truncated file: the answer holds what
was found before, and `error` says where it stopped.

    {"version": 3, "tensors": 291, "keys": 31, "error": null,
     "metadata": {"general.architecture": "llama", "llama.block_count": 32, ...},
     "skipped": ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", ...]}
"""
import math
import os
import struct
from typing import Any, BinaryIO, Dict, List, Tuple

MAX_GGUF_BYTES = 64 << 20  # the header's bytes walked (a 256k-token vocabulary and its merges: ~15 MiB)
MAX_GGUF_KEYS = 4096  # llama.cpp's files carry tens
MAX_GGUF_STRING = 1024  # a name, an architecture, a license: kept; a chat template: skipped
MAX_GGUF_KEY = 65536  # bytes of one key's name: more is not a GGUF file
MAX_SKIPPED_NAMES = 64
# value type -> (struct format, bytes) for the fixed-size ones; 8 is a string, 9 an array.
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
            7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")


class _Stop(Exception):
    """Where the walk ends early: a truncated or garbled file, or a bound reached."""


class _Cursor:
    """Reads and skips through the file a chunk at a time, counting what it walks against
    MAX_GGUF_BYTES and never past the file's end (a skip past it is a truncated file, found without
    reading). The chunk is what keeps walking 400k tokenizer strings well under a second."""

    CHUNK = 1 << 20

    def __init__(self, handle: BinaryIO, size: int) -> None:
        self.handle, self.size = handle, size
        self.buffer, self.offset, self.start = b"", 0, 0  # self.buffer holds the file from self.start

    @property
    def at(self) -> int:
        return self.start + self.offset

    def _advance(self, count: int, what: str) -> None:
        if count < 0 or self.at + count > self.size:
            raise _Stop(f"the file ends inside {what} (at byte {self.at})")
        if self.at + count > MAX_GGUF_BYTES:
            raise _Stop(f"the header is longer than {MAX_GGUF_BYTES >> 20} MiB: stopped at {what}")

    def _fill(self, count: int) -> None:
        """At least `count` bytes (which _advance found in the file) from self.offset on."""
        if self.offset + count <= len(self.buffer):
            return
        self.start, rest = self.at, self.buffer[self.offset:]
        self.handle.seek(self.start + len(rest))
        self.buffer = rest + self.handle.read(max(count - len(rest), self.CHUNK))
        self.offset = 0
        if len(self.buffer) < count:  # the file shrank under the reader
            raise _Stop(f"the file ends at byte {self.start + len(self.buffer)}")

    def take(self, count: int, what: str) -> bytes:
        self._advance(count, what)
        self._fill(count)
        data = self.buffer[self.offset:self.offset + count]
        self.offset += count
        return data

    def skip(self, count: int, what: str) -> None:
        self._advance(count, what)
        if self.offset + count <= len(self.buffer):
            self.offset += count
        else:  # past the chunk: the next read starts there
            self.start, self.buffer, self.offset = self.at + count, b"", 0

    def number(self, fmt: str, width: int, what: str) -> Any:
        self._advance(width, what)
        self._fill(width)
        value = struct.unpack_from(fmt, self.buffer, self.offset)[0]
        self.offset += width
        return value

    def skip_strings(self, count: int, what: str) -> None:
        """`count` strings walked past: within the chunk without a call per string (a vocabulary and
        its merges are 400k of them), the careful way where one crosses the chunk's end."""
        unpack, bound = _LENGTH.unpack_from, MAX_GGUF_BYTES - self.start
        for _ in range(count):
            end = self.offset + 8
            if end <= len(self.buffer):
                end += unpack(self.buffer, self.offset)[0]
                if end <= len(self.buffer) and end <= bound:
                    self.offset = end
                    continue
            self.skip(self.string_length(what), what)
            bound = MAX_GGUF_BYTES - self.start

    def string_length(self, what: str) -> int:
        length = self.number("<Q", 8, what)
        if length > self.size:
            raise _Stop(f"{what} claims {length} bytes, more than the file holds")
        return int(length)


def _skip_array(cursor: _Cursor, key: str, depth: int) -> None:
    elem_type = cursor.number("<I", 4, "the type of array " + key)
    count = cursor.number("<Q", 8, "the length of array " + key)
    if elem_type in _SCALARS:
        cursor.skip(count * _SCALARS[elem_type][1], "array " + key)
    elif elem_type == _STRING:
        if count > cursor.size:
            raise _Stop(f"array {key} claims {count} strings, more than the file holds")
        cursor.skip_strings(count, "a string of array " + key)
    elif elem_type == _ARRAY and depth < 4:
        if count > cursor.size:
            raise _Stop(f"array {key} claims {count} arrays, more than the file holds")
        for _ in range(count):
            _skip_array(cursor, key, depth + 1)
    else:
        raise _Stop(f"array {key} holds values of unknown type {elem_type}")


def _entry(cursor: _Cursor) -> Tuple[str, bool, Any]:
    """One key and its value: (key, kept, value); arrays, long strings and non-finite floats not kept."""
    length = cursor.string_length("a key's length")
    if length > MAX_GGUF_KEY:
        raise _Stop(f"a key of {length} bytes: not a GGUF key")
    key = cursor.take(length, "a key").decode("utf-8", "replace")
    kind = cursor.number("<I", 4, "the type of " + key)
    if kind in _SCALARS:
        fmt, width = _SCALARS[kind]
        value = cursor.number(fmt, width, "the value of " + key)
        if isinstance(value, float) and not math.isfinite(value):
            return key, False, None  # NaN and infinity have no JSON
        return key, True, value
    if kind == _STRING:
        size = cursor.string_length("the length of " + key)
        if size > MAX_GGUF_STRING:
            cursor.skip(size, "the value of " + key)
            return key, False, None
        return key, True, cursor.take(size, "the value of " + key).decode("utf-8", "replace")
    if kind == _ARRAY:
        _skip_array(cursor, key, 0)
        return key, False, None
    raise _Stop(f"{key} has a value of unknown type {kind}")


def read_gguf(path: str) -> Dict[str, Any]:
    """The scalar metadata of the GGUF file at `path`; `error` (else None) says why it is not all there."""
    metadata: Dict[str, Any] = {}
    skipped: List[str] = []
    answer: Dict[str, Any] = {"version": None, "tensors": None, "keys": None, "metadata": metadata,
                              "skipped": skipped, "error": None}
    try:
        with open(path, "rb") as handle:
            cursor = _Cursor(handle, os.fstat(handle.fileno()).st_size)
            magic = handle.read(4) if cursor.size < 4 else cursor.take(4, "the magic")
            if magic != b"GGUF":
                raise _Stop(f"not a GGUF file (it starts with {magic!r})")
            version = cursor.number("<I", 4, "the version")
            if version not in (2, 3):
                raise _Stop(f"GGUF version {version} is not read (2 and 3 are; a big-endian file reads as "
                            "another number)")
            answer["version"] = version
            answer["tensors"] = cursor.number("<Q", 8, "the tensor count")
            keys = cursor.number("<Q", 8, "the key count")
            answer["keys"] = keys
            for index in range(keys):
                if index >= MAX_GGUF_KEYS:
                    raise _Stop(f"more than {MAX_GGUF_KEYS} keys: stopped there")
                key, kept, value = _entry(cursor)
                if kept:
                    metadata[key] = value
                elif len(skipped) < MAX_SKIPPED_NAMES:
                    skipped.append(key)
    except _Stop as exc:
        answer["error"] = str(exc)
    except (OSError, ValueError, struct.error, OverflowError) as exc:
        answer["error"] = f"{type(exc).__name__}: {exc}"
    return answer
