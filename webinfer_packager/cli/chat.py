"""`webinfer chat`: an interactive chat in the terminal: a front end over LLM.chat.completions (webinfer/api.py),
the same path as the HTTP API and the page.

    webinfer chat [PACKAGE] [--max-tokens 512] [--temperature 0.7 --top-p 0.9 --seed 1]
                  [--backend auto|native|cpu|reference]

Each turn sends the whole conversation; the engine's prefix cache finds the blocks of the earlier turns, so only
the new text is prefilled (the stats line says how many prompt tokens came from the cache). The answer streams as
it is generated.

Keys: Ctrl-C during an answer stops that answer (the partial answer stays in the conversation); Ctrl-C or Ctrl-D
at the prompt quits. Commands: /reset (new conversation), /exit.

Threads: input() blocks, so it runs in a daemon thread that hands each line to the event loop; the loop owns
SIGINT (loop.add_signal_handler), which makes Ctrl-C an ordinary event instead of a KeyboardInterrupt that could
land anywhere, e.g. in the middle of a GPU step.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from dataclasses import dataclass

from webinfer.engine.engine import EngineStepError
from webinfer.errors import ContextOverflowError, InvalidRequestError, WebinferError

PROMPT = "> "
HELP = "commands: /reset (new conversation), /exit; Ctrl-C stops an answer, Ctrl-C or Ctrl-D at the prompt quits"


# ---------------------------------------------------------------------------------------------------------------
# input off the event loop


class LineReader:
    """Lines from stdin read in one daemon thread, one line per read() call. A daemon, because a thread blocked
    on a read cannot be stopped: on exit the process simply leaves it behind. On a terminal the thread uses
    input() (line editing, history); otherwise it reads the file descriptor itself, because input() on a pipe
    holds sys.stdin's buffer lock and the interpreter aborts at exit when a daemon thread holds that lock."""

    def __init__(self, loop: asyncio.AbstractEventLoop, out=sys.stdout):
        self.loop, self.out = loop, out
        self.pending: asyncio.Future | None = None
        self.want = threading.Semaphore(0)
        self.prompt = PROMPT
        self.tty = sys.stdin.isatty() and out.isatty()
        if self.tty:
            try:
                import readline  # noqa: F401  (imported for its effect: input() gets line editing and history)
            except ImportError:
                pass
        self._raw = b""
        threading.Thread(target=self._run, name="chat-input", daemon=True).start()

    def _fd_line(self) -> str | None:
        while b"\n" not in self._raw:
            chunk = os.read(0, 4096)
            if not chunk:
                line, self._raw = self._raw, b""
                return line.decode("utf-8", errors="replace") if line else None
            self._raw += chunk
        line, self._raw = self._raw.split(b"\n", 1)
        return line.decode("utf-8", errors="replace").removesuffix("\r")

    def _run(self) -> None:
        while True:
            self.want.acquire()
            try:
                if self.tty:
                    line = input(self.prompt)
                else:
                    self.out.write(self.prompt)
                    self.out.flush()
                    line = self._fd_line()
            except EOFError:
                line = None
            except Exception as e:  # e.g. a closed stdin: report it as the end of input
                print(f"\ninput error: {e}", file=sys.stderr)
                line = None
            self.loop.call_soon_threadsafe(self._deliver, line)
            if line is None:
                return

    def _deliver(self, line: str | None) -> None:
        if self.pending is not None and not self.pending.done():
            self.pending.set_result(line)

    async def read(self, prompt: str = PROMPT) -> str | None:
        """The next line, or None at end of input (Ctrl-D) or when cancel() was called (Ctrl-C)."""
        self.prompt = prompt
        self.pending = self.loop.create_future()
        self.want.release()
        return await self.pending

    def cancel(self) -> bool:
        """End a read() in progress with None; False when no read is waiting."""
        if self.pending is None or self.pending.done():
            return False
        self.pending.set_result(None)
        return True


@dataclass
class Answer:
    text: str
    num_tokens: int
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None
    decode_tok_s: float | None


# ---------------------------------------------------------------------------------------------------------------
# the chat


class Chat:
    def __init__(self, llm, sampling: dict, out=sys.stdout):
        """llm: webinfer.api.LLM; sampling: the request fields of every turn (max_tokens, temperature, ...)."""
        self.llm, self.sampling, self.out = llm, dict(sampling), out
        self.messages: list[dict] = []
        self._task: asyncio.Task | None = None  # the answer being streamed
        self.interrupted = False
        color = hasattr(out, "isatty") and out.isatty()
        self.dim, self.plain = ("\x1b[2m", "\x1b[0m") if color else ("", "")

    def note(self, text: str) -> None:
        self.out.write(f"{self.dim}{text}{self.plain}\n")
        self.out.flush()

    async def answer(self) -> Answer:
        """Stream one answer to the conversation so far. Ctrl-C cancels the consuming task; closing the stream
        then aborts the request (its KV blocks stay in the prefix cache for the next turn)."""
        parts: list[str] = []
        last: list = [None]

        async def consume():
            stream = await self.llm.chat.completions.create(messages=self.messages, stream=True, **self.sampling,
                                                            stream_options={"continuous_usage_stats": True})
            try:
                async for c in stream:
                    last[0] = c
                    piece = c["choices"][0]["delta"].get("content", "")
                    if piece:
                        parts.append(piece)
                        self.out.write(piece)
                        self.out.flush()
            finally:
                await stream.aclose()

        self.interrupted = False
        self._task = asyncio.ensure_future(consume())
        try:
            await self._task
        except asyncio.CancelledError:
            if not self.interrupted:
                raise  # cancelled from outside, not by Ctrl-C
        finally:
            self._task = None
        self.out.write("\n")
        c = last[0]
        if c is None:  # interrupted before the first token
            return Answer("", 0, "abort", 0, 0, None, None)
        u = c["usage"]  # on every chunk (continuous_usage_stats): an interrupted answer has its numbers too
        tpot = u["time_per_output_token_s"]
        return Answer("".join(parts), u["completion_tokens"],
                      "abort" if self.interrupted else c["choices"][0]["finish_reason"], u["prompt_tokens"],
                      u["prompt_tokens_details"]["cached_tokens"], u["ttft_s"], 1.0 / tpot if tpot else None)

    def stats_line(self, a: Answer) -> str:
        ttft = f"TTFT {a.ttft_s:.2f} s" if a.ttft_s is not None else "TTFT -"
        speed = f"{a.decode_tok_s:.1f} tok/s" if a.decode_tok_s is not None else "- tok/s"
        end = {"stop": "", "length": ", stopped at the token limit", "abort": ", interrupted"}.get(a.finish_reason or "", "")
        return (f"[{ttft} · {speed} · {a.num_tokens} tokens · prompt {a.prompt_tokens} tokens, "
                f"{a.cached_tokens} cached{end}]")

    def on_sigint(self, reader: LineReader) -> None:
        if self._task is not None:
            self.interrupted = True
            self._task.cancel()
        elif not reader.cancel():  # neither answering nor at the prompt (between the two): quit too
            raise KeyboardInterrupt

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        reader = LineReader(loop, self.out)
        saved_tty = _save_terminal() if reader.tty else None
        try:
            loop.add_signal_handler(signal.SIGINT, self.on_sigint, reader)
        except (NotImplementedError, RuntimeError):  # no signal handlers here (Windows, non-main thread)
            pass
        self.note(f"{self.llm.model_name} · {HELP}")
        try:
            while True:
                line = await reader.read(PROMPT)
                if line is None:  # Ctrl-D or Ctrl-C at the prompt
                    self.out.write("\n")
                    return 0
                text = line.strip()
                if not text:
                    continue
                if text == "/exit":
                    return 0
                if text == "/reset":
                    self.messages.clear()
                    self.note("(new conversation)")
                    continue
                if text.startswith("/") and " " not in text:  # /help or an unknown command: never sent to the model
                    self.note(HELP if text == "/help" else f"unknown command {text}; {HELP}")
                    continue
                self.messages.append({"role": "user", "content": line})
                try:
                    a = await self.answer()
                except (ContextOverflowError, InvalidRequestError) as e:
                    self.messages.pop()
                    self.note(f"the conversation no longer fits ({e}); /reset to start a new one")
                    continue
                except EngineStepError as e:  # the runner failed this request only; the chat can go on
                    self.messages.pop()
                    self.out.write("\n")
                    self.note(f"error: {e}")
                    continue
                # an interrupted answer stays in the conversation: the next turn continues from what was said
                self.messages.append({"role": "assistant", "content": a.text})
                self.note(self.stats_line(a))
        finally:
            try:
                loop.remove_signal_handler(signal.SIGINT)
            except (NotImplementedError, RuntimeError):
                pass
            await self.llm.close()
            if saved_tty is not None:  # readline may still hold the terminal in its own mode (no echo)
                _restore_terminal(saved_tty)


def _save_terminal():
    try:
        import termios

        return termios.tcgetattr(0)
    except (ImportError, OSError):
        return None


def _restore_terminal(attrs) -> None:
    try:
        import termios

        termios.tcsetattr(0, termios.TCSANOW, attrs)
    except (ImportError, OSError):
        pass


def cli_main(args) -> int:
    from webinfer_packager.cli.backend import engine_options, open_llm
    from webinfer_packager.paths import resolve_package

    if args.max_tokens < 1:
        raise WebinferError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
                "top_k": args.top_k, "seed": args.seed}
    path = resolve_package(args.package)
    print(f"loading {path.name} ...", file=sys.stderr, flush=True)
    # one request at a time: a turn's prompt reuses the earlier turns' blocks through the prefix cache
    llm = open_llm(path, args.backend, options=engine_options(args, max_seqs=1))
    if not llm.prompter.chat_template:
        raise WebinferError(f"{path}: the model has no chat template (manifest chat_template is null); "
                            "pack it with --chat-template FILE, or use `webinfer generate --prompt` instead")
    from webinfer.api import parse_request

    parse_request("chat", {"messages": [{"role": "user", "content": "?"}], **sampling}, llm.limits)  # bad flags: now
    return asyncio.run(Chat(llm, sampling).run())
