"""Content-addressed shard files: tensors' component rows are appended to the current shard (hashing while
writing); a shard is closed and renamed to `<sha256>.bin` when the next rows no longer fit.

Shards are at most `shard_mb` MiB (default 32): objects of that size cache and resume well in the browser
Cache API and on CDNs, give a useful granularity for parallel fetches, and match what tvmjs/web-llm use.
Every component starts at a multiple of 256 bytes (minStorageBufferOffsetAlignment), so a shard uploaded whole
can be bound by range. A tensor larger than what is left is split by rows into several parts.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from webinfer.package import OFFSET_ALIGN

_ZEROS = bytes(OFFSET_ALIGN)


def _align(n: int) -> int:
    return -(-n // OFFSET_ALIGN) * OFFSET_ALIGN


class ShardWriter:
    def __init__(self, folder: Path, shard_bytes: int):
        self.folder, self.cap = Path(folder), int(shard_bytes)
        self.index = -1  # index of the open shard; file names are known only when a shard closes
        self.names: list[str] = []  # names[i] = "<sha>.bin" of closed shard i
        self.files: list[dict] = []  # manifest "files" entries (deduplicated by name)
        self._fh = None
        self._pos = 0

    def _open(self) -> None:
        self.index += 1
        self._fh = open(self.folder / f"shard-{self.index}.partial", "wb")
        self._hash = hashlib.sha256()
        self._pos = 0

    def _close(self) -> None:
        if self._fh is None:
            return
        self._fh.close()
        tmp = self.folder / f"shard-{self.index}.partial"
        digest = self._hash.hexdigest()
        name = f"{digest}.bin"
        if (self.folder / name).exists():  # identical content already written: keep one copy
            tmp.unlink()
        else:
            os.replace(tmp, self.folder / name)
            self.files.append({"name": name, "bytes": self._pos, "sha256": digest})
        self.names.append(name)
        self._fh = None

    def _write(self, data) -> None:
        mv = memoryview(data).cast("B")
        self._fh.write(mv)
        self._hash.update(mv)
        self._pos += len(mv)

    def _rows_that_fit(self, row_bytes: list[int], rows: int) -> int:
        left = self.cap - self._pos - OFFSET_ALIGN * len(row_bytes)  # worst-case alignment padding
        return max(0, min(rows, left // sum(row_bytes)))

    def write_rows(self, comps: dict[str, np.ndarray], r0: int, r1: int) -> list[dict]:
        """Write rows [r0, r1) of each component (uint8 arrays [N, row_bytes]); return manifest parts."""
        row_bytes = [int(a.shape[1]) for a in comps.values()]
        parts = []
        r = r0
        while r < r1:
            if self._fh is None:
                self._open()
            n = self._rows_that_fit(row_bytes, r1 - r)
            if n == 0:
                if self._pos == 0:
                    raise ValueError(f"shard size {self.cap} bytes cannot hold one row ({sum(row_bytes)} bytes)")
                self._close()
                continue
            refs = {}
            for c, a in comps.items():
                pad = _align(self._pos) - self._pos
                if pad:
                    self._write(_ZEROS[:pad])
                refs[c] = {"file": self.index, "offset": self._pos, "bytes": n * int(a.shape[1])}
                self._write(np.ascontiguousarray(a[r:r + n]))
            parts.append({"rows": [r, r + n], "components": refs})
            r += n
        return parts

    def finish(self) -> None:
        self._close()

    def resolve(self, parts: list[dict]) -> None:
        """Replace shard indices in parts by the closed shards' file names."""
        for p in parts:
            for ref in p["components"].values():
                ref["file"] = self.names[ref["file"]]
