"""Reading benchmark records from files: every problem is a ValueError naming the file (and the line), never a
raw traceback. The task records (``task_record.py``) say which fields a record must have; ``check_fields``
checks them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tablefree.fileio import DuplicateKeyError, no_duplicate_keys

_FOREIGN_BOMS = {
    b"\xff\xfe\x00\x00": "UTF-32",
    b"\x00\x00\xfe\xff": "UTF-32",
    b"\xff\xfe": "UTF-16",
    b"\xfe\xff": "UTF-16",
}
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def read_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of each non-blank line of a UTF-8 file (a UTF-8 byte-order mark is skipped)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ValueError(f"{path}: cannot read ({error.strerror or error})") from None
    for bom, encoding in _FOREIGN_BOMS.items():
        if data.startswith(bom):
            raise ValueError(f"{path}: starts with a {encoding} byte-order mark; evaluation files are UTF-8")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            lines.append((number, raw.decode("utf-8")))
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{path}:{number}: invalid UTF-8 (byte 0x{raw[error.start]:02x} at byte {error.start + 1} of "
                "the line); evaluation files are UTF-8"
            ) from None
    return lines


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_line(line: str, where: str) -> dict:
    """One JSON object; malformed JSON, NaN, absurd numbers, nesting and a key twice are errors naming
    ``where``."""
    try:
        record = json.loads(line, parse_constant=_no_constant, object_pairs_hook=no_duplicate_keys)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: malformed JSON ({error.msg} at column {error.colno})") from None
    except DuplicateKeyError as error:
        raise ValueError(f"{where}: {error} (a key may appear once; which value is meant?)") from None
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply") from None
    except ValueError as error:  # integers over sys.get_int_max_str_digits() digits, NaN, Infinity
        raise ValueError(f"{where}: unreadable JSON value ({str(error).split(';')[0]})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if _SURROGATE_ESCAPE.search(line) and _has_lone_surrogate(record):
        raise ValueError(f"{where}: a \\u escape encodes half of a UTF-16 surrogate pair, not a character")
    return record


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


def read_jsonl(path: Path, limit: int | None = None) -> list[tuple[str, dict]]:
    """(``file:line``, record) for each non-blank line, or the first ``limit`` of them (only those are parsed:
    a run of 300 documents does not pay for a 10,000-line file); a bad line is an error naming file and line."""
    return parse_lines(path, read_lines(path)[:limit])


def parse_lines(path: Path, lines: list[tuple[int, str]]) -> list[tuple[str, dict]]:
    """(``file:line``, record) of each (line number, text) of ``path``."""
    return [(f"{path}:{number}", parse_json_line(line, f"{path}:{number}")) for number, line in lines]


def check_fields(where: str, record: dict, schema: dict[str, type | tuple[type, ...]]) -> None:
    """Every field of ``schema`` is in ``record`` with one of its JSON types; the error names ``where``."""
    for name, kind in schema.items():
        if name not in record:
            raise ValueError(f"{where}: missing field {name!r}")
        value = record[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # JSON true/false are bool, which Python also counts as int: an int field never takes them
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            expected = " or ".join(k.__name__ for k in kinds)
            raise ValueError(f"{where}: field {name!r} must be {expected}, got {short(value)}")


def short(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters, for error messages."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**limit else "a huge integer"
    return text if len(text) <= limit else text[: limit - 1] + "…"
