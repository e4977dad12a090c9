"""The server over HTTP with the real SmolLM2 on the numpy reference runner (no GPU).
Run: WEBINFER_TEST_PACKAGE=... python -m pytest tests/test_server_model.py -q -m model"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.test_server import ServerThread

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_real_model_over_http_matches_reference(smollm2_package):
    from tokenizers import Tokenizer as HFTokenizer

    from webinfer.chat_template import render
    from webinfer.package import Package
    from webinfer_packager.server.app import create_app
    from webinfer_packager.reference.model import ReferenceModel, Sampler, generate, limit_blas_threads
    from webinfer_packager.cli.backend import open_llm

    limit_blas_threads(1)
    llm = open_llm(smollm2_package, "reference")
    pkg = Package.open(smollm2_package)
    hf = HFTokenizer.from_str(json.dumps(pkg.tokenizer_json()))
    plain = ReferenceModel.from_package(pkg)

    msgs = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Say hi."}]
    chat_ids = hf.encode(render(pkg.chat_template, msgs, add_generation_prompt=True), add_special_tokens=False).ids
    want_chat = generate(plain, chat_ids, 5, Sampler(0.0), pkg.config.eos_token_ids)
    want_story = generate(plain, hf.encode("Once upon a time").ids, 6, Sampler(0.0), pkg.config.eos_token_ids)

    with ServerThread(create_app(llm)) as url:
        async def main():
            async with httpx.AsyncClient(timeout=120) as c:
                story = c.post(url + "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 6,
                                                              "temperature": 0})
                chat = c.post(url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 5, "temperature": 0})

                async def streamed():
                    ids, text = [], ""
                    body = {"messages": msgs, "max_tokens": 5, "temperature": 0, "stream": True}
                    async with c.stream("POST", url + "/v1/chat/completions", json=body) as s:
                        async for line in s.aiter_lines():
                            if line.startswith("data: {"):
                                ch = json.loads(line[6:])["choices"][0]
                                ids += ch["token_ids"]
                                text += ch["delta"]["content"]
                    return ids, text
                return await asyncio.gather(story, chat, streamed())

        story, chat, (s_ids, s_text) = asyncio.run(main())
        m = httpx.get(url + "/metrics").text

    assert story.json()["choices"][0]["token_ids"] == want_story
    assert story.json()["choices"][0]["text"] == hf.decode(want_story)
    assert story.json()["choices"][0]["text"].startswith(", the city of")  # transformers' greedy answer
    c = chat.json()["choices"][0]
    assert c["token_ids"] == want_chat == s_ids and c["message"]["content"] == s_text
    assert c["message"]["content"] == hf.decode([t for t in want_chat if t not in pkg.config.eos_token_ids],
                                                skip_special_tokens=True)
    assert 'webinfer_kv_blocks_used{model="' in m and [ln for ln in m.splitlines()
                                                        if ln.startswith("webinfer_kv_blocks_used")][0].endswith(" 0")
