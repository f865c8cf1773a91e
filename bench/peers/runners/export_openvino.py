"""GGUF -> Hugging Face directory -> OpenVINO IR (fp32), run with the openvino venv's python:

    python export_openvino.py MODEL.gguf OUT_DIR

transformers reads the GGUF (Q4_1 dequantized to float32) but its ``save_pretrained`` refuses a
GGUF-loaded model, so the config, weights (``safetensors.torch.save_model``, which keeps one
copy of the tied embedding), generation config and tokenizer are saved one by one; then
``optimum-cli export openvino`` (run in process) writes the IR and the OpenVINO tokenizer into
``OUT_DIR/ir``.

optimum-intel 2.2.0 refuses to export Gemma 3 with the venv's transformers 5.5.4 ("ValueError:
The current version of Transformers does not allow for the export of the model. Maximum required
is 5.0, got: 5.5.4": its Gemma 1-3 configs cap transformers at 5.0, its Gemma 4 one allows
5.10). The cap is lifted for ``gemma3_text`` alone; the IR it writes gives transformers' greedy
tokens (the benchmark's "first tokens = transformers" column checks it on every run).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path


def export_hf(gguf: Path, hf_dir: Path) -> None:
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    hf_dir.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(hf_dir)
    model.generation_config.save_pretrained(hf_dir)
    save_model(model, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(hf_dir)


def export_ir(hf_dir: Path, ir_dir: Path) -> None:
    from optimum.commands.optimum_cli import main as optimum_cli
    from optimum.exporters.openvino import model_configs

    model_configs.Gemma3TextOpenVINOConfig.MAX_TRANSFORMERS_VERSION = None  # see above
    sys.argv = ["optimum-cli", "export", "openvino", "--model", str(hf_dir), "--task",
                "text-generation-with-past", "--weight-format", "fp32", str(ir_dir)]
    with contextlib.redirect_stdout(sys.stderr):
        optimum_cli()


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: export_openvino.py MODEL.gguf OUT_DIR")
    gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
    print(f"reading {gguf} with transformers", file=sys.stderr, flush=True)
    export_hf(gguf, out / "hf")
    print("optimum-cli export openvino", file=sys.stderr, flush=True)
    export_ir(out / "hf", out / "ir")


if __name__ == "__main__":
    main()
