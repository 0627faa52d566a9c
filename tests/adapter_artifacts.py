"""LoRA adapter artifacts for the tests that need no real weights: an adapter_config.json and a placeholder weights
file, which is all registration reads (the real-engine tests build real weights: scripts/build_tiny_lora.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

LORA_OPTIONS = {"max_loras": 2, "max_lora_rank": 16}


def write_adapter(root: Path, relative: str, *, rank: int = 8, base_model: str = "llama-13b", weights: bool = True):
    directory = root / relative
    directory.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 16, "base_model_name_or_path": base_model}
    config["target_modules"] = ["q_proj", "v_proj"]
    (directory / "adapter_config.json").write_text(json.dumps(config))
    if weights:
        (directory / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    return directory


@pytest.fixture
def lora_root(tmp_path, settings) -> Path:
    """An empty LoRA storage root for the test (``INFERCAP["LORA_ROOT"]``)."""
    root = tmp_path / "lora-root"
    root.mkdir()
    settings.INFERCAP = {**settings.INFERCAP, "LORA_ROOT": str(root)}
    return root
