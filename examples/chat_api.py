"""Two conversations at once through webinfer's OpenAI-shaped Python API, on the native GPU engine.

    webinfer pack                       # once: packs SmolLM2-135M-Instruct
    python examples/chat_api.py [PACKAGE]

Both requests share one engine: the scheduler batches their decode steps (continuous batching) over one paged KV
cache. The same API runs inside the browser's Web Worker (webinfer/browser_worker.py).
"""

import asyncio
import sys

import webinfer

QUESTIONS = ["What is the capital of France?", "Name three colors of the rainbow."]


async def ask(llm, question: str) -> str:
    parts = []
    stream = await llm.chat.completions.create(messages=[{"role": "user", "content": question}],
                                               max_tokens=48, temperature=0, stream=True)
    async for chunk in stream:
        parts.append(chunk["choices"][0]["delta"].get("content", ""))
    return "".join(parts)


async def main(llm):
    answers = await asyncio.gather(*(ask(llm, q) for q in QUESTIONS))
    for q, a in zip(QUESTIONS, answers):
        print(f"> {q}\n{a}\n")
    await llm.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        path = sys.argv[1]
    else:
        from webinfer_packager.paths import resolve_package

        path = resolve_package(None)  # the packed default model
    asyncio.run(main(webinfer.open(path)))  # open() loads the model synchronously; the API runs in the loop
