"""GGUF -> Hugging Face directory -> OpenVINO IR (fp32), run with the openvino venv's python:

    python export_openvino.py MODEL.gguf OUT_DIR

``export_hf.py`` writes the model and its tokenizer into ``OUT_DIR/hf``; then
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

from export_hf import export_hf


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
    export_hf(gguf, out / "hf", tokenizer=True)
    print("optimum-cli export openvino", file=sys.stderr, flush=True)
    export_ir(out / "hf", out / "ir")


if __name__ == "__main__":
    main()
