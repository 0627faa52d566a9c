"""Build a tiny random-weight Llama that real vLLM can serve offline, for the end-to-end tests against the engine.

No model hub is reachable here, so the model is made from nothing: a byte-level BPE tokenizer trained on generated
text, a chat template, and seeded random weights (2 layers, hidden 256, 4 heads / 2 KV heads; ~3.3 M parameters).
Run it with the engine environment's Python (it needs torch, transformers and tokenizers):

    .venv-engine/bin/python scripts/build_tiny_model.py [--out var/engine/tiny-llama] [--seed 0]

Idempotent: a model already built with the same recipe is left alone. The files appear at once (built in a
temporary folder beside the target, then renamed), so a half-written model is never served.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "var" / "engine" / "tiny-llama"
STAMP = ".infercap-tiny-model"

VOCAB_SIZE = 4096
CORPUS_LINES = 20_000
SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]
# The turn ends with the eos token, so a reply that emits it stops there as an instruct model's does.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
MODEL = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
}
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
)


def recipe(seed: int) -> str:
    """What the model is made from; a change in any of it rebuilds the model."""
    spec = {"seed": seed, "vocab": VOCAB_SIZE, "lines": CORPUS_LINES, "special": SPECIAL_TOKENS}
    spec |= {"template": CHAT_TEMPLATE, "model": MODEL, "version": 2}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def is_built(out: Path, seed: int) -> bool:
    stamp = out / STAMP
    return (
        stamp.is_file()
        and stamp.read_text().strip() == recipe(seed)
        and all((out / f).is_file() for f in REQUIRED_FILES)
    )


def corpus(seed: int, lines: int = CORPUS_LINES) -> list[str]:
    """Generated English-like text: syllable words, numbers and punctuation, so the BPE learns a varied vocabulary."""
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "ch"]
    nuclei = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
    codas = ["", "", "n", "r", "s", "t", "l", "nd", "ng", "st"]
    words = [
        "".join(rng.choice(onsets) + rng.choice(nuclei) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
        for _ in range(3000)
    ]
    words += ["the", "a", "of", "and", "to", "in", "is", "what", "how", "please", "answer", "question", "model"]
    text = []
    for _ in range(lines):
        sentence = [rng.choice(words) if rng.random() > 0.08 else str(rng.randint(0, 9999)) for _ in range(12)]
        text.append(" ".join(sentence).capitalize() + rng.choice([".", "?", "!", ","]))
    return text


def build_tokenizer(seed: int):
    # Deferred: tokenizers and transformers exist only in the engine's interpreter (.venv-engine), and are heavy.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL["max_position_embeddings"],
    )


def _portable_tokenizer_config(path: Path) -> None:
    """transformers 5 writes its own tokenizer class name and keeps the chat template in chat_template.jinja;
    the generic class and an inline template let older transformers (a GPU vLLM's) load the same folder."""
    config = json.loads(path.read_text())
    config |= {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}
    path.write_text(json.dumps(config, indent=2) + "\n")


def build(out: Path, seed: int) -> None:
    # Deferred: torch and transformers exist only in the engine's interpreter (.venv-engine), and are heavy.
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer(seed)
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in ("<|bos|>", "<|eos|>", "<|pad|>")}
    config = LlamaConfig(
        **MODEL, bos_token_id=ids["<|bos|>"], eos_token_id=ids["<|eos|>"], pad_token_id=ids["<|pad|>"]
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|bos|>"], eos_token_id=ids["<|eos|>"], pad_token_id=ids["<|pad|>"]
    )

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        _portable_tokenizer_config(staging / "tokenizer_config.json")
        staging.chmod(0o755)  # mkdtemp makes it private; the engine may run as another user
        (staging / STAMP).write_text(recipe(seed) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    parameters = sum(p.numel() for p in model.parameters())
    print(f"    {parameters / 1e6:.2f} M parameters, vocabulary {len(tokenizer)}, eos id {ids['<|eos|>']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="model folder (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the corpus and the weights")
    parser.add_argument("--force", action="store_true", help="rebuild even when the model is already built")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if not args.force and is_built(out, args.seed):
        print(f"==> tiny model already built in {out}")
        return 0
    started = time.monotonic()
    print(f"==> building the tiny model in {out} (seed {args.seed})")
    build(out, args.seed)
    print(f"==> done in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
