"""Build random LoRA adapters for the tiny test model (scripts/build_tiny_model.py), for the real-engine LoRA tests.

No model hub and no ``peft`` here: the adapter is written as peft saves one, an ``adapter_config.json`` and an
``adapter_model.safetensors`` holding ``lora_A``/``lora_B`` for ``q_proj`` and ``v_proj`` of every layer, with seeded
random weights (B is not zero, so the adapter changes the output). Run it with the engine environment's Python:

    .venv-engine/bin/python scripts/build_tiny_lora.py --model var/engine/tiny-llama --out DIR [--rank 8] [--seed 0]
        [--base-model NAME]

``--base-model`` is what the config names as ``base_model_name_or_path`` (default: the model directory).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TARGETS = ("q_proj", "v_proj")


def projection_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of each target projection of a Llama config."""
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    return {
        "q_proj": (hidden, config["num_attention_heads"] * head_dim),
        "v_proj": (hidden, config["num_key_value_heads"] * head_dim),
    }


def build(model_dir: Path, out: Path, *, rank: int, seed: int, base_model: str | None) -> Path:
    # Deferred: torch and safetensors exist only in the engine's interpreter (.venv-engine), and torch is heavy.
    import torch
    from safetensors.torch import save_file

    config = json.loads((model_dir / "config.json").read_text())
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for target, (fan_in, fan_out) in projection_shapes(config).items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) * 0.02
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model or str(model_dir),
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(TARGETS),
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="the tiny model's directory")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-model", default=None)
    args = parser.parse_args()
    print(build(args.model, args.out, rank=args.rank, seed=args.seed, base_model=args.base_model))


if __name__ == "__main__":
    main()
