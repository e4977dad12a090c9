"""Grammar-mask benchmark: milliseconds per token to compute the allowed-token bitmask (webinfer/grammar/), CPython.

    python -m webinfer_packager.bench.grammar [PACKAGE] [--quick] [--json] [--output FILE]
    webinfer bench --grammar [PACKAGE] [--quick]          (the same, from the CLI)

Vocabularies: the package's tokenizer (SmolLM2: 49,152 tokens) and a synthetic 152,000-token byte-level BPE (the
package's vocabulary plus merges of random token pairs, built as a `tokenizers` BPE model, then read back by
webinfer's tokenizer: Qwen2.5's vocabulary size). Workloads, per vocabulary:
    documents   realistic outputs (JSON documents for a schema, for one of exact-repetition patterns, for one of
                class-loop patterns, for one of length-bounded strings and for json_object, text for a regex and a
                GBNF grammar) tokenized and fed token by token: the mask is computed before each token, as
                decoding does;
    random      64 tokens drawn at random among the allowed ones (odd states a real model rarely reaches).
Each workload runs on a fresh grammar cache, with the vocabulary's shared rule masks cleared ("cold": the first
request with that grammar; per-state masks are computed on first use, inside the timed step) and again on the same
cache ("warm": a second request with the same schema). Reported: compile ms, then p50 / p99 /
max ms per token over every timed step of each mode. The budget (issue 11): p50 <= 2 ms, p99 <= 10 ms.
The machine may be shared: say so when quoting the numbers.

--pyodide also runs the same measurement inside Pyodide under Node (web/node_modules/pyodide, or
WEBINFER_PYODIDE_DIR): the webinfer sources and both tokenizer.json files are copied into its file system.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from webinfer.grammar import GrammarCache, GrammarMatcher, TokenVocab
from webinfer.tokenizer import Tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": r"^[a-z0-9.]+@[a-z]+\.(com|org|net)$"},
        "role": {"enum": ["admin", "user", "guest"]},
        "score": {"type": "number", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                                     "zip": {"type": "string", "pattern": r"^\d{5}$"}},
                    "required": ["city"], "additionalProperties": False},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
DOCS = [
    {"name": "Ada Lovelace", "age": 36, "email": "ada@analytical.org", "role": "admin", "score": 99.5,
     "tags": ["math", "engines", "poetry"], "address": {"street": "12 St James's Square", "city": "London",
                                                        "zip": "12345"}, "active": True},
    {"name": "Bob", "age": 7, "role": "guest", "tags": [], "active": False},
    {"name": "Zoë Ñúñez-García", "age": 42, "role": "user", "score": 12.25,
     "address": {"city": "Zaragoza"}},
]
# exact repetitions of a class (not shift chains: what follows comes after exactly j), the kind of identifier and
# code patterns schemas carry; 29 such properties took 28 s to compile on Gemma 3 before TokenMasks._class_run
PATTERNS = {"type": "object", "properties": {
    **{f"p{j}": {"type": "string", "pattern": f"^[a-z]{{{j}}}-[0-9]+$"} for j in range(1, 13)},
    "code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
    "phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{3}-[0-9]{4}$"}}, "additionalProperties": False}
PATTERN_DOCS = [{**{f"p{j}": "thequickbrown"[:j] + f"-{j}" for j in range(1, 13)}, "code": "ABC12",
                 "phone": "555-123-4567"}]
# patterns that loop over a class (`[a-z]+`), as form schemas carry them: ~2 s to compile on Gemma 3 before
# TokenMasks._class_loop
LOOPS = {"type": "object", "properties": {
    "name": {"type": "string", "pattern": "^[A-Za-z ]+$"},
    "tag": {"type": "string", "pattern": "^[a-z]+$"},
    "slug": {"type": "string", "pattern": "^[a-z0-9]+(-[a-z0-9]+)*$"},
    "code": {"type": "string", "pattern": "^[A-Z0-9]+$"},
    "word": {"type": "string", "pattern": "^[a-z]{2,}$"},
    "email": {"type": "string", "pattern": "^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$"},
    "phone": {"type": "string", "pattern": "^\\+?[0-9 ()-]+$"},
    "city": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
    "color": {"type": "string", "pattern": "^#[0-9a-fA-F]+$"},
    "ident": {"type": "string", "pattern": "^[a-z_][a-z0-9_]*$"}},
    "required": ["name", "email"], "additionalProperties": False}
LOOP_DOCS = [{"name": "Ada Lovelace", "tag": "math", "slug": "analytical-engine-2", "code": "AE1843",
              "word": "engines", "email": "ada.lovelace@analytical.org", "phone": "+44 (20) 7946-0000",
              "city": "London", "color": "#1a2B3c", "ident": "note_g"},
             {"name": "Bob", "email": "bob@example.com"}]
# strings bounded by minLength / maxLength, as form and Pydantic schemas carry them (`constr(min_length=1)`); a
# string of 3 to 12 characters took 4.7 s to compile on Gemma 3 before TokenMasks._char_run
LENGTHS = {"type": "object", "properties": {
    "username": {"type": "string", "minLength": 3, "maxLength": 20},
    "title": {"type": "string", "minLength": 1, "maxLength": 100},
    "code": {"type": "string", "minLength": 6, "maxLength": 6},
    "comment": {"type": "string", "minLength": 1},
    "tags": {"type": "array", "items": {"type": "string", "minLength": 2, "maxLength": 12}, "maxItems": 5}},
    "required": ["username", "title", "code"], "additionalProperties": False}
LENGTH_DOCS = [{"username": "ada_l", "title": "Notes on the Analytical Engine", "code": "AE1843",
                "comment": "Zoë's copy — \"annotated\"", "tags": ["math", "engines", "Ñandú"]},
               {"username": "bob", "title": "Hi", "code": "B00001"}]
REGEX = r"(\+\d{1,3} )?\(\d{3}\) \d{3}-\d{4}( ext\. \d{1,5})?"
REGEX_TEXTS = ["+44 (020) 794-6000", "(555) 123-4567 ext. 89"]
GBNF = r'''
root   ::= call ("\n" call)*
call   ::= name "(" ws args? ws ")"
name   ::= [a-z_] [a-z0-9_]*
args   ::= arg (ws "," ws arg)*
arg    ::= [a-z_]+ ws "=" ws value
value  ::= number | string | "true" | "false" | "None"
number ::= "-"? [0-9]+ ("." [0-9]+)?
string ::= "\"" [^"\\\n]* "\""
ws     ::= " "?
'''
GBNF_TEXTS = ['get_weather(city="Paris", days=3)\nsend_email(to="bob@example.com", subject="Hi there", urgent=false)']

SYNTH_VOCAB = 152_000


def package_tokenizer_json(package: Path) -> dict:
    from webinfer.package import Package

    return Package.open(package).tokenizer_json()


def synthetic_tokenizer(base: dict, size: int = SYNTH_VOCAB, seed: int = 0) -> dict:
    """base's (a byte-level BPE tokenizer.json) vocabulary extended to `size` tokens by merges of random pairs of its tokens (a byte-level BPE built
    with the `tokenizers` library, so vocabulary and merges are consistent), read back by webinfer's tokenizer."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = dict(base["model"]["vocab"])
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in base["model"]["merges"]]
    words = [t for t in vocab if len(t) > 1]
    rng = random.Random(seed)
    while len(vocab) < size:
        a, b = rng.choice(words), rng.choice(words)
        if a + b not in vocab and len(a + b) <= 24:
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    return json.loads(hf.to_str())


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _summary(ms: list[float]) -> dict:
    return {"steps": len(ms), "p50_ms": round(statistics.median(ms), 3), "p99_ms": round(_pct(ms, 0.99), 3),
            "max_ms": round(max(ms), 3)}


def _feed(masks, ids: list[int], stop: int, times: list[float]) -> None:
    m = GrammarMatcher(masks, [stop])
    for t in ids + [stop]:
        t0 = time.perf_counter()
        mask = m.mask()
        times.append((time.perf_counter() - t0) * 1000)
        if not (mask >> t) & 1 or not m.accept(t):
            raise AssertionError(f"token {t} was not allowed: the benchmark's text does not fit its grammar")


def _random(masks, stop: int, steps: int, rng: random.Random, times: list[float]) -> None:
    m = GrammarMatcher(masks, [stop])
    for _ in range(steps):
        t0 = time.perf_counter()
        mask = m.mask()
        times.append((time.perf_counter() - t0) * 1000)
        bits = bin(mask)[:1:-1]  # bit i at index i (a shift per id would be quadratic at 152k ids)
        t = rng.choice([i for i, c in enumerate(bits) if c == "1"])
        m.accept(t)
        if m.is_terminated():
            m = GrammarMatcher(masks, [stop])


def bench_vocab(tok: Tokenizer, quick: bool) -> dict:
    t0 = time.perf_counter()
    vocab = TokenVocab.from_tokenizer(tok)
    out: dict = {"vocab": vocab.size, "trie_nodes": len(vocab.children),
                 "vocab_build_ms": round((time.perf_counter() - t0) * 1000, 1), "workloads": {}}
    # the stop token (allowed only where a document may end): a special token (no bytes) if there is one
    stop = next((i for i, b in enumerate(vocab.token_bytes) if b is None), 0)
    work = [
        ("json_schema", {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
         [json.dumps(d, ensure_ascii=False, indent=i) for d in DOCS for i in (None, 2)]),
        ("json_object", {"type": "json_object"}, [json.dumps(d, ensure_ascii=False) for d in DOCS]),
        ("patterns", {"type": "json_schema", "json_schema": {"schema": PATTERNS}},
         [json.dumps(d, indent=i) for d in PATTERN_DOCS for i in (None, 2)]),
        ("loops", {"type": "json_schema", "json_schema": {"schema": LOOPS}},
         [json.dumps(d, indent=i) for d in LOOP_DOCS for i in (None, 2)]),
        ("lengths", {"type": "json_schema", "json_schema": {"schema": LENGTHS}},
         [json.dumps(d, ensure_ascii=False, indent=i) for d in LENGTH_DOCS for i in (None, 2)]),
        ("regex", {"type": "regex", "regex": REGEX}, REGEX_TEXTS),
        ("gbnf", {"type": "grammar", "grammar": GBNF}, GBNF_TEXTS),
    ]
    rng = random.Random(0)
    every = {"cold": [], "warm": []}
    for name, rf, texts in work:
        print(f"grammar bench: vocab {vocab.size}: {name}", file=sys.stderr, flush=True)
        if quick:
            texts = texts[:2]
        cache = GrammarCache(vocab)
        vocab.clear_rule_cache()  # compile from scratch: no rule masks left by the previous workload
        t0 = time.perf_counter()
        masks = cache.get(rf)
        compile_ms = (time.perf_counter() - t0) * 1000
        res: dict = {"compile_ms": round(compile_ms, 1)}
        for mode in ("cold", "warm"):  # warm: the same cache again (a second request with this grammar)
            times: list[float] = []
            for text in texts:
                _feed(masks, tok.encode(text), stop, times)
            _random(masks, stop, 16 if quick else 64, rng, times)
            res[mode] = _summary(times)
            every[mode] += times
        res["nodes"] = masks.g.n_nodes
        out["workloads"][name] = res
    out["all"] = {mode: _summary(ts) for mode, ts in every.items()}
    return out


def run(package: Path, quick: bool = False, pyodide: bool = False) -> dict:
    """The budgets on the package's vocabulary and, for a byte-level one under 152k tokens, on a synthetic 152k
    extension of it (a package as big already, Gemma 3's 262k SentencePiece vocabulary, is measured as it is)."""
    base_json = package_tokenizer_json(package)
    base = Tokenizer.from_json(base_json)
    res = {"budget": {"p50_ms": 2.0, "p99_ms": 10.0}, "python": "CPython",
           "vocabularies": {"package": bench_vocab(base, quick)}}
    synth_json = None
    if base.vocab_size < SYNTH_VOCAB and base.byte_level:
        t0 = time.perf_counter()
        synth_json = synthetic_tokenizer(base_json)
        synth = Tokenizer.from_json(synth_json)
        synth_ms = (time.perf_counter() - t0) * 1000
        res["vocabularies"]["synthetic_152k"] = bench_vocab(synth, quick)
        res["vocabularies"]["synthetic_152k"]["build_tokenizer_ms"] = round(synth_ms, 1)
    if pyodide:
        res["pyodide"] = run_pyodide(base_json, synth_json, quick)
    return res


_NODE_SCRIPT = r"""
import { existsSync, readFileSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
const [pyodideDir, srcRoot, work, quick] = process.argv.slice(2);
const { loadPyodide } = await import(join(pyodideDir, "pyodide.mjs"));
const py = await loadPyodide({ indexURL: pyodideDir + "/" });
function copy(dir, to) {
  py.FS.mkdirTree(to);
  for (const f of readdirSync(dir)) {
    const p = join(dir, f);
    if (statSync(p).isDirectory()) { if (f !== "__pycache__") copy(p, to + "/" + f); }
    else if (f.endsWith(".py")) py.FS.writeFile(to + "/" + f, readFileSync(p));
  }
}
copy(join(srcRoot, "webinfer"), "/src/webinfer");
py.FS.writeFile("/src/grammar_bench.py", readFileSync(join(srcRoot, "webinfer_packager", "bench", "grammar.py")));
const files = ["base.json", "synth.json"].filter((f) => existsSync(join(work, f)));
for (const f of files) py.FS.writeFile("/" + f, readFileSync(join(work, f)));
const out = await py.runPythonAsync(`
import sys, json
sys.path.insert(0, "/src")
from grammar_bench import bench_vocab
from webinfer.tokenizer import Tokenizer
res = {name: bench_vocab(Tokenizer.from_json(json.load(open("/" + f))), ${quick === "1" ? "True" : "False"})
       for name, f in (("package", "base.json"), ("synthetic_152k", "synth.json")) if f in ${JSON.stringify(files)}}
json.dumps({"python": "Pyodide " + sys.version.split()[0], "vocabularies": res})
`);
console.log(out);
"""


def run_pyodide(base_json: dict, synth_json: dict | None, quick: bool) -> dict:
    """bench_vocab for the vocabularies inside Pyodide (Node; synth_json None: the package's only); {"error": ...}
    when Node or Pyodide is missing."""
    root = Path(__file__).resolve().parents[2]
    pdir = Path(os.environ.get("WEBINFER_PYODIDE_DIR") or root / "web" / "node_modules" / "pyodide")
    if not (pdir / "pyodide.mjs").is_file():
        return {"error": f"no Pyodide at {pdir} (npm install in web/, or set WEBINFER_PYODIDE_DIR)"}
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "base.json").write_text(json.dumps(base_json), encoding="utf-8")
        if synth_json is not None:
            Path(tmp, "synth.json").write_text(json.dumps(synth_json), encoding="utf-8")
        script = Path(tmp, "run.mjs")
        script.write_text(_NODE_SCRIPT, encoding="utf-8")
        try:
            p = subprocess.run(["node", str(script), str(pdir), str(root), tmp, "1" if quick else "0"],
                               capture_output=True, text=True, timeout=3600)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"error": f"node failed: {e}"}
    if p.returncode != 0:
        return {"error": f"node exited {p.returncode}: {p.stderr[-2000:]}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def format_table(res: dict) -> str:
    tables = [_table(res)]
    if isinstance(res.get("pyodide"), dict) and "vocabularies" in res["pyodide"]:
        tables.append(res["pyodide"]["python"] + ":\n" + _table(res["pyodide"]))
    return "\n".join(tables)


def _table(res: dict) -> str:
    lines = [f"{'vocab':>8} {'workload':<12} {'compile ms':>10} {'cold p50':>9} {'p99':>7} {'max':>8} "
             f"{'warm p50':>9} {'p99':>7} {'max':>8}"]
    for vname, v in res["vocabularies"].items():
        rows = list(v["workloads"].items()) + [("ALL", {"compile_ms": float("nan"), **v["all"]})]
        for w, r in rows:
            c, h = r["cold"], r["warm"]
            lines.append(f"{v['vocab']:>8} {w:<12} {r['compile_ms']:>10.1f} {c['p50_ms']:>9.3f} {c['p99_ms']:>7.2f} "
                         f"{c['max_ms']:>8.1f} {h['p50_ms']:>9.3f} {h['p99_ms']:>7.2f} {h['max_ms']:>8.1f}")
    return "\n".join(lines)


def cli_main(args) -> int:
    from webinfer_packager.paths import resolve_package

    res = run(resolve_package(args.package), quick=args.quick, pyodide=getattr(args, "pyodide", False))
    text = json.dumps(res, indent=2)
    if getattr(args, "output", None):
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    if not getattr(args, "json", False):
        print(format_table(res))
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("package", nargs="?")
    ap.add_argument("--quick", action="store_true", help="fewer texts and random steps")
    ap.add_argument("--json", action="store_true", help="print only JSON")
    ap.add_argument("--output", help="also write the JSON here")
    ap.add_argument("--pyodide", action="store_true", help="also measure inside Pyodide (Node)")
    return cli_main(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
