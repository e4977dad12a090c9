"""Tool calls (OpenAI `tools` / `tool_choice`): the request's checks, the chat template's call format, the grammar
that forces a call, and the parser that turns the model's text into `message.tool_calls` (streaming and not).

Formats (recognised from the chat template's source):
- "hermes" (Qwen2.5, Hermes 2 Pro, many fine-tunes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  several in a row for parallel calls, optionally after some text;
- "llama3_json" (Llama 3.1 / 3.2 JSON tool calling): the whole reply is `{"name": ..., "parameters": {...}}`,
  several separated by `;`.
The parser is incremental: it streams text until a call starts, then the call's id and name as soon as the name is
complete, then argument fragments as they are produced (OpenAI's delta.tool_calls). A call it cannot read (not JSON,
no name) is handed back as text, as other servers do. Pure Python: runs in Pyodide.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from webinfer.errors import InvalidRequestError


@dataclass(frozen=True)
class ToolFormat:
    name: str
    begin: str      # what opens one call ("" : the reply starts with the JSON object)
    end: str        # what closes one call
    args_key: str   # "arguments" or "parameters"
    sep: str = ""   # between parallel calls, besides white space


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>", "arguments")
LLAMA3_JSON = ToolFormat("llama3_json", "", "", "parameters", ";")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's rule for function names


def template_format(template: str | None) -> ToolFormat | None:
    """The tool-call format a chat template teaches its model (None: not one of ours)."""
    if not template:
        return None
    if "<tool_call>" in template:
        return HERMES
    if '"parameters"' in template or "<|python_tag|>" in template:
        return LLAMA3_JSON
    return None


def check_tools(tools) -> list[dict]:
    """OpenAI's `tools`: [{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}]."""
    if not isinstance(tools, list) or len(tools) > 128:
        raise InvalidRequestError("tools", "must be a list of at most 128 {\"type\": \"function\", \"function\": {...}}")
    out, seen = [], set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise InvalidRequestError(f"tools[{i}]", "must be {\"type\": \"function\", \"function\": {\"name\": ...}}")
        extra = set(fn) - {"name", "description", "parameters", "strict"}
        if extra:
            raise InvalidRequestError(f"tools[{i}].function.{sorted(extra)[0]}", "is not a field of a function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidRequestError(f"tools[{i}].function.name", "must be 1-64 letters, digits, _ . or -")
        if name in seen:
            raise InvalidRequestError(f"tools[{i}].function.name", f"{name!r} is defined twice")
        seen.add(name)
        if not isinstance(fn.get("description", ""), str):
            raise InvalidRequestError(f"tools[{i}].function.description", "must be a string")
        if not isinstance(fn.get("parameters", {}), dict):
            raise InvalidRequestError(f"tools[{i}].function.parameters", "must be a JSON Schema object")
        if not isinstance(fn.get("strict", False), (bool, type(None))):
            raise InvalidRequestError(f"tools[{i}].function.strict", "must be true or false")
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    return out


def check_tool_choice(choice, tools: list[dict]):
    """"none" | "auto" | "required" | {"type": "function", "function": {"name": one of tools}}; the default is
    "auto" with tools and "none" without (OpenAI's). Returns the choice, a name for a named function."""
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise InvalidRequestError("tool_choice", "\"required\" needs `tools`")
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) and isinstance(
        choice.get("function"), dict) and choice.get("type") == "function" else None
    if not isinstance(name, str):
        raise InvalidRequestError("tool_choice", "must be \"none\", \"auto\", \"required\" or "
                                                 "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    if not any(t["function"]["name"] == name for t in tools):
        raise InvalidRequestError("tool_choice", f"names {name!r}, which is not in `tools`")
    return {"name": name}


def grammar_key(tools: list[dict], choice, fmt: ToolFormat, parallel: bool) -> dict:
    """What a forced call's grammar depends on (the GrammarCache key)."""
    chosen = tools if choice == "required" else [t for t in tools if t["function"]["name"] == choice["name"]]
    return {"tool_calls": chosen, "format": fmt.name, "parallel": parallel}


def call_grammar(key: dict):
    """The grammar for grammar_key(...): well-formed calls whose arguments validate against the function's schema."""
    from webinfer.grammar import tool_call_grammar

    fmt = HERMES if key["format"] == HERMES.name else LLAMA3_JSON
    begin, end = (fmt.begin + "\n", "\n" + fmt.end) if fmt.begin else ("", "")
    return tool_call_grammar(key["tool_calls"], begin, end, key["parallel"], args_key=fmt.args_key, sep=fmt.sep)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_.-]{1,64})"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class ToolCallParser:
    """Model text in (deltas), events out: ("content", text), ("call", index, id, name), ("args", index, fragment).

    feed(delta) returns the events the text so far makes certain; feed(delta, final=True) flushes the rest."""

    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        self.buf = ""
        self.state = "text" if fmt.begin else "start"
        self.n_calls = 0
        self._value = None  # JSON value scanner state in "args": [started, depth, in_string, escaped]

    def feed(self, text: str, final: bool = False) -> list[tuple]:
        self.buf += text
        ev: list[tuple] = []
        while self._step(ev, final):
            pass
        if final and self.buf:
            if self.state == "head":  # a call that never got a readable head: try it whole, else it is text
                self._whole_call(self.buf, ev, closed=False)
            elif self.state in ("text", "plain", "start") and (self.buf.strip() or not self.n_calls):
                ev.append(("content", self.buf))
            self.buf = ""
        return ev

    def _step(self, ev: list, final: bool) -> bool:
        """Advance one state if the buffer allows; False when more text is needed."""
        f, b = self.fmt, self.buf
        if self.state == "start":  # llama3_json: the reply is calls iff it starts with "{"
            s = b.lstrip()
            if not s:
                return False
            self.state = "head" if s[0] == "{" else "plain"
            return True
        if self.state == "plain":
            if b:
                ev.append(("content", b))
                self.buf = ""
            return False
        if self.state == "text":
            i = b.find(f.begin)
            if i >= 0:
                if b[:i].strip():
                    ev.append(("content", b[:i].rstrip()))
                self.buf, self.state = b[i + len(f.begin):], "head"
                return True
            keep = self._held(b)
            if keep:
                ev.append(("content", b[:keep]))
                self.buf = b[keep:]
            return False
        if self.state == "head":
            m = _HEAD.match(b)
            if m:
                ev.append(("call", self.n_calls, new_call_id(), m.group(1)))
                self.buf, self.state, self._value = b[m.end():], "args", [False, 0, False, False]
                return True
            if f.end and f.end in b:  # a complete call we could not read as it came
                i = b.index(f.end)
                self._whole_call(b[:i], ev)
                self.buf, self.state = b[i + len(f.end):], "text"
                return True
            return False
        if self.state == "args":
            if not self._value[0]:
                b = b.lstrip()  # white space before the value is not part of the arguments
            done = self._scan(b)
            frag = b[:done] if done is not None else b
            if frag:
                ev.append(("args", self.n_calls, frag))
            self.buf = b[len(frag):]
            if done is None:
                return False
            self.n_calls += 1
            self.state = "tail"
            return True
        if self.state == "tail":  # after the arguments: the call object's "}" and the end marker
            close = f.end or "}"
            i = b.find(close)
            if i < 0:
                return False
            self.buf, self.state = b[i + len(close):], "text" if f.begin else "between"
            return True
        if self.state == "between":  # llama3_json: ";" and the next call, or the end
            s = b.lstrip()
            if f.sep and s.startswith(f.sep):
                s = s[len(f.sep):].lstrip()
            if not s:
                return False
            self.buf, self.state = s, "head" if s[0] == "{" else "plain"
            return True
        return False

    def _held(self, b: str) -> int:
        """Where the text that could still be white space + the start of a call begins (held back)."""
        begin = self.fmt.begin
        for k in range(max(0, len(b) - len(begin) - 64), len(b)):
            t = b[k:].lstrip()
            if begin.startswith(t):
                return k
        return len(b)

    def _scan(self, b: str) -> int | None:
        """Scan one JSON value (the arguments) through b; the length of b up to its end, None if it goes on."""
        v = self._value
        for i, ch in enumerate(b):
            if not v[0]:
                if ch.isspace():
                    continue
                v[0] = True
                if ch in "{[":
                    v[1] = 1
                elif ch == '"':
                    v[2] = True
                continue
            if v[2]:
                if v[3]:
                    v[3] = False
                elif ch == "\\":
                    v[3] = True
                elif ch == '"':
                    v[2] = False
                    if v[1] == 0:
                        return i + 1
                continue
            if ch == '"':
                v[2] = True
            elif ch in "{[":
                v[1] += 1
            elif ch in "}]":
                v[1] -= 1
                if v[1] == 0:
                    return i + 1
            elif v[1] == 0 and (ch in ",}" or ch.isspace()):  # a bare scalar ends
                return i
        return None

    def _whole_call(self, text: str, ev: list, closed: bool = True) -> None:
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        args = obj.get(self.fmt.args_key, obj.get("arguments")) if isinstance(obj, dict) else None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and args is not None:
            ev.append(("call", self.n_calls, new_call_id(), obj["name"]))
            ev.append(("args", self.n_calls, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
            self.n_calls += 1
        else:
            ev.append(("content", self.fmt.begin + text + (self.fmt.end if closed else "")))


def collect(events: list[tuple]) -> tuple[str, list[dict]]:
    """Events -> (content, tool_calls) of a non-streamed message."""
    content, calls = [], []
    for e in events:
        if e[0] == "content":
            content.append(e[1])
        elif e[0] == "call":
            calls.append({"id": e[2], "type": "function", "function": {"name": e[3], "arguments": ""}})
        else:
            calls[e[1]]["function"]["arguments"] += e[2]
    return "".join(content), calls


def delta_calls(events: list[tuple]) -> list[dict]:
    """The call events of one streamed chunk as OpenAI's delta.tool_calls."""
    out: list[dict] = []
    for e in events:
        if e[0] == "call":
            out.append({"index": e[1], "id": e[2], "type": "function", "function": {"name": e[3], "arguments": ""}})
        elif e[0] == "args":
            if out and out[-1]["index"] == e[1]:
                out[-1]["function"]["arguments"] += e[2]
            else:
                out.append({"index": e[1], "function": {"arguments": e[2]}})
    return out
