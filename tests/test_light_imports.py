"""The router, the client SDK and the CLI's front door never import torch."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["router.main", "router.service", "router.openai_api.app",
                                    "router.openai_api.server", "snapstream.client",
                                    "decode_svc.sequence", "cli.main", "serving.convert",
                                    "hwsim", "snapstream.finish"])
def test_module_does_not_import_torch(module):
    code = f"import sys, {module}; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, module
