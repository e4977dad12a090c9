"""`webinfer verify PACKAGE`: validate the manifest, re-hash every file, check sizes and that every tensor part
lies inside its file, then run the checks that read more than the manifest (Package.validate: tokenizer ids within
vocab_size, a chat template that renders a small conversation within its bounds). Prints one line per problem and
exits non-zero naming each bad file.

    verify_package(Path("pkg"))  # -> [] when the package is intact
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from webinfer.errors import FormatError, WebinferError
from webinfer.package import MANIFEST, Package

_CHUNK = 8 << 20


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def verify_package(path: Path) -> list[str]:
    """Problems found, each naming the file; empty when the package is intact."""
    path = Path(path)
    try:
        pkg = Package.open(path)  # validates the manifest, including parts inside the recorded file sizes
    except FormatError as e:
        return [str(e)]
    problems = []
    for name, entry in pkg.files.items():
        f = path / name
        if not f.is_file():
            problems.append(f"{f}: missing")
            continue
        size = f.stat().st_size
        if size != entry["bytes"]:
            problems.append(f"{f}: {size} bytes, the manifest says {entry['bytes']}")
            continue
        digest = _sha256(f)
        if digest != entry["sha256"]:
            problems.append(f"{f}: sha256 {digest}, the manifest says {entry['sha256']}")
    listed = set(pkg.files) | {MANIFEST}
    for f in sorted(path.iterdir()):
        if f.name not in listed:
            problems.append(f"{f}: not listed in the manifest")
    if not problems:  # validate() reads every file: only meaningful once they are all intact
        try:
            pkg.validate()
        except (WebinferError, json.JSONDecodeError) as e:
            problems.append(str(e))
    return problems


def cli_main(args) -> int:
    problems = verify_package(Path(args.package))
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{args.package}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"{args.package}: ok")
    return 0
