"""The training scripts on one GPU under ``accelerate launch`` with bf16 mixed precision.

Builds a small Llama-shaped checkpoint (hidden 512, 8 heads of dim 64, 4 layers, MHA) with a byte-level
BPE tokenizer trained on Python's pydoc text, then runs ``scripts/uptrain.py`` (converting to 2 KV
heads on the fly) and ``scripts/finetune_long.py`` (packed 4k rows, gradient checkpointing) through
``accelerate launch --num_processes 1 --mixed_precision bf16``, and prints their reports.

    python scripts/gpu_scripts_smoke.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_checkpoint(out: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    from hf_flashpatch import text_data

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(text_data.pydoc_documents(), trainers.BpeTrainer(
        vocab_size=2048, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))  # fmt: skip
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")
    config = AutoConfig.for_model(
        "llama", vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=8192,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def launch(script: str, args: list[str]) -> None:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--mixed_precision", "bf16",
               str(ROOT / "scripts" / script), *args]  # fmt: skip
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/scripts_gpu")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = build_checkpoint(out / "tiny_mha")
    common = ["--model", str(checkpoint), "--source", "pydoc", "--text-cache", str(out / "text")]
    launch("uptrain.py", [*common, "--output-dir", str(out / "uptrain"), "--kv-heads", "2", "--seq-len", "1024",
                          "--batch-size", "4", "--lr", "1e-3", "--max-steps", "30", "--eval-every", "15", "--epochs", "5"])  # fmt: skip
    launch("finetune_long.py", [*common, "--output-dir", str(out / "long"), "--seq-len", "4096", "--batch-size", "1",
                                "--lr", "1e-3", "--max-steps", "10", "--epochs", "5", "--gradient-checkpointing"])  # fmt: skip
    for name in ("uptrain", "long"):
        report = json.loads((out / name / "report.json").read_text())
        keep = {k: v for k, v in report.items() if not isinstance(v, (list, dict))}
        print(name, json.dumps(keep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
