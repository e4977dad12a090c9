"""`webinfer chat` driven as a real program through pipes, on a tiny random-weight package.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/test_chat_cli.py -q

The program runs in a subprocess with stdin/stdout pipes; SIGINT is sent while an answer streams. Checks: the
answer stops (stats line says interrupted) and the program answers the next question; the second turn's prompt
holds the partial answer (its token count equals the `tokenizers` library's count for the ChatML text of the
whole conversation, built here by hand) and reuses cached KV blocks; /reset starts over; Ctrl-C and Ctrl-D at the
prompt quit with status 0.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.gpu

STATS = re.compile(r"\[TTFT (?P<ttft>[\d.]+) s · (?P<speed>[\d.]+|-) tok/s · (?P<n>\d+) tokens · "
                   r"prompt (?P<prompt>\d+) tokens, (?P<cached>\d+) cached(?P<end>[^\]]*)\]\n")


@pytest.fixture(scope="module")
def tiny_chat_package(tmp_path_factory):
    from webinfer_packager.pack.build import pack
    from tests.synthetic import write_hf

    tmp = tmp_path_factory.mktemp("chat")
    write_hf(tmp / "hf", max_position_embeddings=1024)
    return pack(tmp / "hf", tmp / "pkg", progress=False)


class Program:
    """The chat CLI in a subprocess; a thread collects its stdout so the test can wait for text."""

    def __init__(self, package, *extra):
        env = dict(os.environ, PYTHONIOENCODING="utf-8", PYTHONUNBUFFERED="1")
        env.setdefault("XDG_RUNTIME_DIR", "/tmp/xdg")
        os.makedirs(env["XDG_RUNTIME_DIR"], mode=0o700, exist_ok=True)
        self.p = subprocess.Popen([sys.executable, "-m", "webinfer_packager.cli.main", "chat", str(package), *extra],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.buf = b""
        self.lock = threading.Lock()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        while chunk := os.read(self.p.stdout.fileno(), 4096):
            with self.lock:
                self.buf += chunk

    @property
    def out(self) -> str:
        with self.lock:
            return self.buf.decode("utf-8", errors="replace")

    def wait_for(self, pred, timeout=60.0, what=""):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred(self.out):
                return self.out
            if self.p.poll() is not None:
                time.sleep(0.2)
                if pred(self.out):
                    return self.out
                break
            time.sleep(0.02)
        self.p.kill()
        pytest.fail(f"waiting for {what}: rc={self.p.poll()}\nstdout: {self.out[-2000:]!r}\n"
                    f"stderr: {self.p.stderr.read().decode(errors='replace')[-2000:]}")

    def send(self, line: str):
        self.p.stdin.write((line + "\n").encode())
        self.p.stdin.flush()

    def finish(self, timeout=30) -> int:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            pytest.fail(f"the program did not exit; stdout: {self.out[-1000:]!r}")


def _chatml(messages) -> str:
    """The synthetic package's ChatML template, written out by hand (the program renders it with jinja2)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


def _hf_tokenizer(package):
    from tokenizers import Tokenizer as HF

    from webinfer.package import Package

    return HF.from_str(json.dumps(Package.open(package).tokenizer_json()))


def test_interrupt_keeps_program_and_history(gpu, tiny_chat_package):
    # the GPU path (lavapipe here): on a software adapter `--backend auto` takes the CPU engine, which decodes this
    # tiny model at ~19k tok/s, so 300 tokens could end before the interrupt arrived (it did once)
    prog = Program(tiny_chat_package, "--backend", "native", "--max-tokens", "300")
    prog.wait_for(lambda o: o.endswith("> "), what="the first prompt")
    start = len(prog.out)
    prog.send("hello world")
    prog.wait_for(lambda o: len(o) > start + 3, what="the first answer to start streaming")
    prog.p.send_signal(signal.SIGINT)
    out = prog.wait_for(lambda o: STATS.search(o, start) and o.endswith("> "), what="the interrupted answer's stats")
    m1 = STATS.search(out, start)
    assert "interrupted" in m1["end"] and 0 < int(m1["n"]) < 300, m1.group()
    answer1 = out[start:m1.start()]
    assert answer1.endswith("\n")
    answer1 = answer1[:-1]

    start = len(out)
    prog.send("once upon a time")
    out = prog.wait_for(lambda o: STATS.search(o, start) and o.endswith("> "), timeout=120, what="the second answer")
    m2 = STATS.search(out, start)
    assert "interrupted" not in m2["end"] and int(m2["n"]) > 0, m2.group()

    # the second prompt is the whole conversation, partial answer included, re-rendered and re-tokenized
    hf = _hf_tokenizer(tiny_chat_package)
    convo = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": answer1},
             {"role": "user", "content": "once upon a time"}]
    assert int(m1["prompt"]) == len(hf.encode(_chatml(convo[:1]), add_special_tokens=False).ids)
    assert int(m2["prompt"]) == len(hf.encode(_chatml(convo), add_special_tokens=False).ids)
    # turn 1's prompt blocks (21 tokens: one full 16-token block) come from the prefix cache
    assert int(m1["cached"]) == 0 and 16 <= int(m2["cached"]) <= int(m2["prompt"]) and int(m2["cached"]) % 16 == 0

    start = len(out)
    prog.send("/reset")
    prog.wait_for(lambda o: "(new conversation)" in o[start:] and o.endswith("> "), what="/reset")
    prog.p.send_signal(signal.SIGINT)  # Ctrl-C at the prompt quits
    assert prog.finish() == 0


def test_reset_and_eof(gpu, tiny_chat_package):
    """After /reset the prompt is the first turn's again (same token count); Ctrl-D (stdin closed) quits."""
    prog = Program(tiny_chat_package, "--max-tokens", "5", "--temperature", "0.8", "--seed", "3")
    prog.send("hello world")
    prog.send("/reset")
    prog.send("hello world")
    prog.send("/nonsense")
    prog.p.stdin.close()
    assert prog.finish(60) == 0
    out = prog.out
    stats = list(STATS.finditer(out))
    assert len(stats) == 2, out
    assert stats[0]["prompt"] == stats[1]["prompt"] and int(stats[0]["n"]) <= 5
    assert "(new conversation)" in out and "unknown command /nonsense" in out


def test_terminal(gpu, tiny_chat_package):
    """On a pseudo-terminal: input() with line editing, the stats line dimmed, Ctrl-C mid-answer stops it, Ctrl-C
    at the prompt quits, and the terminal's mode (echo, canonical input) is what it was before."""
    import pty
    import select
    import termios

    env = dict(os.environ, PYTHONIOENCODING="utf-8", TERM="xterm")
    env.setdefault("XDG_RUNTIME_DIR", "/tmp/xdg")
    pid, fd = pty.fork()
    if pid == 0:  # child: the chat on the pty's slave side
        os.execve(sys.executable, [sys.executable, "-m", "webinfer_packager.cli.main", "chat", str(tiny_chat_package),
                                   "--max-tokens", "300"], env)
    before = termios.tcgetattr(fd)
    buf = bytearray()

    def until(pred, timeout=60.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            text = buf.decode("utf-8", errors="replace")
            if pred(text):
                return text
            try:
                if select.select([fd], [], [], 0.05)[0]:
                    buf.extend(os.read(fd, 4096))
            except OSError:  # the child closed the pty
                break
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"pty output: {bytes(buf)[-1500:]!r}")

    until(lambda t: t.endswith("> "))
    start = len(buf)
    os.write(fd, b"hello world\r")
    until(lambda t: len(t) > start + len("hello world\r\n") + 3)
    os.kill(pid, signal.SIGINT)
    text = until(lambda t: "interrupted]" in t and t.endswith("> "))
    assert "\x1b[2m[TTFT" in text  # dim on a terminal
    os.kill(pid, signal.SIGINT)  # Ctrl-C at the prompt, while readline holds the terminal in its own mode
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    after = termios.tcgetattr(fd)
    assert after[3] & (termios.ECHO | termios.ICANON) == before[3] & (termios.ECHO | termios.ICANON)
    os.close(fd)
