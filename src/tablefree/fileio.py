"""Reading and writing tablefree's small text files (JSON, YAML, JSONL outputs).

Outputs are written atomically: a synced temp file renamed into place, so a reader (or a crash) never sees a
half-written file that looks whole. Malformed JSON is reported with the file and line. The data layer, training,
evaluation and the reports all write through here; ``tablefree.checkpoint`` re-exports these names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a synced temp file and a rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: str | Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: str | Path) -> Any:
    """A JSON file; malformed JSON is a ValueError that names the file and line."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: malformed JSON ({error.msg} at line {error.lineno})") from None
