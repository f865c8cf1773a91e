"""GGUF -> Hugging Face directory, run with a peer venv's python:

    python export_hf.py MODEL.gguf OUT_DIR [--tokenizer]

transformers reads the GGUF (its blocks dequantized to float32; parsing the metadata of Gemma 3's
262k-token vocabulary alone takes minutes) but its ``save_pretrained`` refuses a GGUF-loaded
model, so the config, weights (``safetensors.torch.save_model``, which keeps one copy of the tied
embedding) and generation config are saved one by one, and with ``--tokenizer`` the tokenizer
(its conversion takes minutes more). The directory then loads in seconds.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def export_hf(gguf: Path, hf_dir: Path, tokenizer: bool) -> None:
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    hf_dir.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(hf_dir)
    model.generation_config.save_pretrained(hf_dir)
    save_model(model, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer:
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name
                                      ).save_pretrained(hf_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer", action="store_true")
    args = parser.parse_args()
    export_hf(args.gguf, args.out, args.tokenizer)


if __name__ == "__main__":
    main()
