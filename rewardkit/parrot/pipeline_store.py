"""The PARROT pipeline's stage files: append-only JSON Lines keyed by row, repaired on reopening after a crash, so a
stage resumes without duplicates or gaps. Importable from :mod:`rewardkit.parrot.pipeline` as before."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["JsonlStore"]


class JsonlStore:
    """An append-only JSONL file keyed by ``key(record)``: the last record of a key wins.

    Opening repairs the end of the file so that appends start on a line boundary: a last line without its
    newline is kept (the newline added) when it is a whole record (a JSON object: a valid record written by
    another tool, or a crash between the record and its newline), and cut off only when it does not parse (a
    crash mid-write).
    """

    def __init__(self, path: str | Path, key: Callable[[dict[str, Any]], Any]) -> None:
        self.path = Path(path)
        self.key = key
        self.records: dict[Any, dict[str, Any]] = {}
        if self.path.is_file():
            data = self.path.read_bytes()
            end = data.rfind(b"\n") + 1
            if end < len(data):  # a last line without its newline
                try:
                    whole = isinstance(json.loads(data[end:].decode("utf-8")), dict)
                except (ValueError, UnicodeDecodeError):
                    whole = False
                with open(self.path, "r+b") as f:
                    if whole:  # a complete record: keep it, end the line
                        f.seek(0, os.SEEK_END)
                        f.write(b"\n")
                        data += b"\n"
                    else:  # half a record from a crash mid-write: drop it
                        f.truncate(end)
                        data = data[:end]
                    f.flush()
                    os.fsync(f.fileno())
            for n, line in enumerate(data.decode("utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{self.path}:{n}: not JSON ({exc}); fix or delete the file") from None
                self.records[self.key(rec)] = rec

    def __contains__(self, k: Any) -> bool:
        return k in self.records

    def get(self, k: Any) -> dict[str, Any] | None:
        return self.records.get(k)

    def __len__(self) -> int:
        return len(self.records)

    def append(self, recs: Sequence[dict[str, Any]]) -> None:
        if not recs:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        blob = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in recs)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        for r in recs:
            self.records[self.key(r)] = r

    def compact(self) -> None:
        """Rewrite the file with one line per key (after retried records superseded older ones); atomic."""
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for r in self.records.values():
                f.write(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def compact_if_needed(self) -> None:
        if self.path.is_file():
            with open(self.path, "rb") as f:
                n = sum(1 for line in f if line.strip())
            if n != len(self.records):
                self.compact()
