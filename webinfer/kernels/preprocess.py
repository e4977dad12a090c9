"""A tiny, deterministic WGSL preprocessor: variants of one .wgsl file without string-pasting in Python.

Directives (one per line, first non-blank characters of the line):
    #define NAME value      substitute NAME (whole word) by value in the lines that follow
    #ifdef NAME / #ifndef NAME / #if NAME == value / #if NAME != value / #else / #endif
    #include "file.wgsl"   paste another shader file (from the same folder), preprocessed with the same defines

Defines given by the caller (the variant key) come first; a `#define` in the file does not override them, so a file
can state its defaults as `#define TILE 16`. Names are matched as whole words.
"""

from __future__ import annotations

import re
from typing import Callable

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class PreprocessError(ValueError):
    pass


def preprocess(source: str, defines: dict[str, object], load: Callable[[str], str] | None = None,
               name: str = "<wgsl>", _depth: int = 0) -> str:
    if _depth > 8:
        raise PreprocessError(f"{name}: #include nested too deeply")
    defs = {k: str(v) for k, v in defines.items()}
    fixed = set(defs)  # caller's defines win over the file's defaults
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (this branch active, some branch already taken)
    active = True
    for lineno, line in enumerate(source.splitlines(), 1):
        s = line.strip()
        if s.startswith("#"):
            parts = s.split(None, 1)
            d, rest = parts[0], (parts[1] if len(parts) > 1 else "")
            where = f"{name}:{lineno}"
            if d in ("#ifdef", "#ifndef", "#if"):
                parent = active
                if d == "#if":
                    m = re.fullmatch(r"(\w+)\s*(==|!=)\s*(\S+)", rest.strip())
                    if not m:
                        raise PreprocessError(f"{where}: expected '#if NAME == value' or '!='")
                    val = defs.get(m.group(1))
                    cond = (val == m.group(3)) if m.group(2) == "==" else (val != m.group(3))
                else:
                    cond = (rest.strip() in defs) == (d == "#ifdef")
                stack.append((parent, cond))
                active = parent and cond
            elif d == "#else":
                if not stack:
                    raise PreprocessError(f"{where}: #else without #if")
                parent, taken = stack[-1]
                stack[-1] = (parent, True)
                active = parent and not taken
            elif d == "#endif":
                if not stack:
                    raise PreprocessError(f"{where}: #endif without #if")
                active = stack.pop()[0]
            elif not active:
                continue
            elif d == "#define":
                kv = rest.split(None, 1)
                if not kv:
                    raise PreprocessError(f"{where}: #define needs a name")
                if kv[0] not in fixed:
                    defs[kv[0]] = kv[1].strip() if len(kv) > 1 else ""
            elif d == "#include":
                fname = rest.strip().strip('"')
                if load is None:
                    raise PreprocessError(f"{where}: #include without a loader")
                inc = preprocess(load(fname), defs, load, fname, _depth + 1)
                out.append(inc)
            else:
                raise PreprocessError(f"{where}: unknown directive {d}")
            continue
        if active:
            out.append(_WORD.sub(lambda m: defs.get(m.group(0), m.group(0)), line) if defs else line)
    if stack:
        raise PreprocessError(f"{name}: unterminated #if")
    return "\n".join(out) + "\n"
