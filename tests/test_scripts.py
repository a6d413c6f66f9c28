"""The uptraining and long-context scripts end to end at tiny scale (CPU), resume, and 2-process DDP on CPU.

A tiny random Llama (2 layers, hidden 64, 4 heads) with a byte-level BPE tokenizer trained here on
Python's pydoc text keeps every run to seconds; the real text path (gensim's Wikipedia) is covered by
``test_text_corpus_*`` and ``test_gqa_quality.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_flashpatch
from hf_flashpatch import text_data
from hf_flashpatch.training import TrainArgs, train

from tiny_llama import save_tiny_llama

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), docs=40, vocab_size=384, hidden=64, heads=4, max_positions=1024)


@pytest.fixture(scope="module")
def text_cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("text"))


def common_args(checkpoint, text_cache, **overrides) -> list[str]:
    args = {"model": checkpoint, "source": "pydoc", "text_cache": text_cache, "max_train_docs": 12,
            "seq_len": 64, "batch_size": 4, "lr": 3e-3, "eval_sequences": 8, "eval_batch_size": 8} | overrides
    flags = []
    for name, value in args.items():
        flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


def run_script(argv: list[str], **popen) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, **popen)
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def test_uptrain_script_end_to_end(tiny_checkpoint, text_cache, tmp_path):
    out = tmp_path / "run"
    run_script([sys.executable, "scripts/uptrain.py", *common_args(tiny_checkpoint, text_cache),
                "--output-dir", str(out), "--max-steps", "12", "--eval-every", "6", "--save-every", "5",
                "--kv-heads", "2"])
    report = json.loads((out / "report.json").read_text())
    assert report["attn_implementation"] == hf_flashpatch.ATTN_NAME  # the plugin's backend by default
    assert report["steps"] == 12 and report["tokens"] == 12 * 4 * 64
    assert report["last_loss"] < report["first_loss"] - 0.3
    perplexities = [e["perplexity"] for e in report["evals"]]
    assert [e["step"] for e in report["evals"]] == [0, 6, 12]
    assert perplexities[2] < perplexities[1] < perplexities[0]
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(out / "final")
    assert final.config.num_key_value_heads == 2  # converted on the fly, saved as a plain checkpoint
    assert (out / "checkpoint" / "trainer_state.json").is_file()


def test_token_budget_sets_the_steps(tiny_checkpoint, text_cache, tmp_path):
    args = TrainArgs(model=str(tiny_checkpoint), output_dir=str(tmp_path / "budget"), source="pydoc",
                     text_cache=text_cache, max_train_docs=12, seq_len=64, batch_size=4,
                     token_fraction=0.05, pretrain_tokens=20_000, eval_sequences=2)
    report = train(args)
    assert report["max_steps"] == 4 and report["tokens"] == 4 * 256  # ceil(1000 / 256)


def test_resume_after_interrupt_loses_nothing(tiny_checkpoint, text_cache, tmp_path):
    """Interrupted by SIGINT at step 7, resumed: same losses and bit-identical final weights as one run.

    One short document gives 9 rows: 9 batches of 1 row, gradient accumulation 2, so 4 steps per epoch
    and one leftover batch dropped each epoch. The run crosses 3 epoch boundaries (reshuffles) and
    resumes mid-epoch: the data position and the RNG/optimizer/scheduler states all matter.
    """
    from safetensors.torch import load_file

    settings = dict(model=str(tiny_checkpoint), source="pydoc", text_cache=text_cache, max_train_docs=1,
                    seq_len=64, batch_size=1, grad_accum=2, lr=3e-3, max_steps=14, eval_sequences=2)
    whole = train(TrainArgs(output_dir=str(tmp_path / "whole"), **settings))

    def interrupt_at_7(step, loss):
        if step == 7:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does; the loop stops at the step boundary

    first = train(TrainArgs(output_dir=str(tmp_path / "split"), **settings), on_step_end=interrupt_at_7)
    assert first["interrupted"] and first["steps"] == 7
    checkpoint = tmp_path / "split" / "checkpoint"
    saved = {p.name for p in checkpoint.iterdir()}
    assert {"optimizer.bin", "scheduler.bin", "trainer_state.json"} <= saved and any("random_states" in s for s in saved)
    assert not (tmp_path / "split" / "final").exists()
    second = train(TrainArgs(output_dir=str(tmp_path / "split"), **settings))
    assert not second["interrupted"] and second["steps"] == 14
    assert second["losses"] == whole["losses"]
    assert whole["max_steps"] == 14 and len(whole["losses"]) == 14
    a = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    b = load_file(tmp_path / "split" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_finetune_long_packs_documents_without_padding(tiny_checkpoint, text_cache, tmp_path, monkeypatch):
    """In-process so the varlen calls can be counted: every training forward goes through cu_seqlens."""
    from hf_flashpatch import api

    seen = []
    varlen = api.flash_attn_varlen_func

    def counting(q, k, v, cu_q, cu_k, *args, **kwargs):
        seen.append((q.shape[0], cu_q.tolist()))
        return varlen(q, k, v, cu_q, cu_k, *args, **kwargs)

    monkeypatch.setattr(api, "flash_attn_varlen_func", counting)
    # Short documents (a few lines of pydoc each), so that every 512-token row holds several of them.
    lines = [line for doc in text_data.pydoc_documents()[:20] for line in doc.splitlines() if len(line) > 40]
    short_docs = ["\n".join(lines[i:i + 3]) for i in range(0, 600, 3)]
    (tmp_path / "short.txt").write_text("\n\n".join(short_docs[:180]))
    (tmp_path / "short_eval.txt").write_text("\n\n".join(short_docs[180:]))
    args = TrainArgs(model=str(tiny_checkpoint), output_dir=str(tmp_path / "long"), data=str(tmp_path / "short.txt"),
                     eval_data=str(tmp_path / "short_eval.txt"), packing="flatten", seq_len=512, batch_size=1,
                     gradient_checkpointing=True, lr=3e-3, max_steps=4, eval_sequences=2, eval_seq_len=64)
    report = train(args)
    assert report["steps"] == 4 and report["peak_memory_bytes"] > 0 and report["tokens_per_s"] > 0
    assert 0 < report["tokens"] <= 4 * 512
    assert seen, "the packed batches never reached the varlen path"
    for total, cu in seen:
        assert cu[0] == 0 and cu[-1] == total <= 512  # one row, boundaries cover exactly its tokens
    assert all(len(cu) > 2 for _, cu in seen), seen  # several documents in every row


def test_finetune_long_script_end_to_end(tiny_checkpoint, text_cache, tmp_path):
    out = tmp_path / "long"
    result = run_script([sys.executable, "scripts/finetune_long.py",
                         *common_args(tiny_checkpoint, text_cache, max_train_docs=30, eval_seq_len=64),
                         "--seq-len", "512", "--output-dir", str(out), "--max-steps", "4"])
    assert "tokens/s, peak memory" in result.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] == 4 and report["attn_implementation"] == hf_flashpatch.ATTN_NAME


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_cpu_processes_match_one_process(tiny_checkpoint, text_cache, tmp_path):
    """DDP over 2 CPU processes (gloo) with batch 2 each = one process with batch 4: same losses."""
    flags = common_args(tiny_checkpoint, text_cache, batch_size=2) + ["--max-steps", "8", "--eval-every", "8"]
    run_script([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(free_port()), "scripts/uptrain.py", *flags,
                "--output-dir", str(tmp_path / "ddp")])
    ddp = json.loads((tmp_path / "ddp" / "report.json").read_text())
    single = train(TrainArgs(model=str(tiny_checkpoint), output_dir=str(tmp_path / "one"), source="pydoc",
                             text_cache=text_cache, max_train_docs=12, seq_len=64, batch_size=4, lr=3e-3,
                             eval_sequences=8, eval_batch_size=8, max_steps=8, eval_every=8))
    assert ddp["num_processes"] == 2 and ddp["tokens"] == single["tokens"] == 8 * 4 * 64
    assert ddp["losses"][-1] < ddp["losses"][0] - 0.3
    assert ddp["losses"] == pytest.approx(single["losses"], abs=2e-3)
    assert ddp["evals"][-1]["perplexity"] == pytest.approx(single["evals"][-1]["perplexity"], rel=1e-3)


@pytest.mark.parametrize("name, kind", [("accelerate_ddp.yaml", "MULTI_GPU"), ("accelerate_fsdp.yaml", "FSDP")])
def test_accelerate_configs_parse(name, kind):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(ROOT / "configs" / name))
    assert config.distributed_type == kind
    if kind == "FSDP":
        assert config.fsdp_config["fsdp_version"] == 2


def test_text_corpus_from_gensim_wikipedia(tmp_path):
    pytest.importorskip("gensim")
    files = text_data.write_text_corpus(tmp_path, source="wiki")
    assert (tmp_path / "SOURCE").read_text().strip() == "wiki"
    splits = text_data.load_text_splits(files["train"], eval_data=files["eval"])
    assert len(splits["train"]) > 80 and len(splits["eval"]) >= 9
    assert set(splits["train"]["text"]).isdisjoint(splits["eval"]["text"])
    first = splits["train"][0]["text"]
    assert first.startswith("Anarchism\n") and "'''" not in first and "==" not in first


def test_packing_helpers():
    import datasets

    docs = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11, 12]]})
    rows = text_data.pack_fixed_length(docs, 4)
    assert rows["input_ids"] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    pieces = text_data.split_long_documents(docs, 4)
    assert pieces["input_ids"] == [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11, 12]]
    assert text_data.flattening_batches([3, 2, 4, 3], 5) == [[0, 1], [2], [3]]
    with pytest.raises(ValueError, match="document 1 has 9 tokens > max_tokens=5"):
        text_data.flattening_batches([3, 9], 5)


def test_data_order_is_a_function_of_seed_and_epoch():
    from hf_flashpatch.training import EpochShuffleSampler, PackBatchSampler

    sampler = EpochShuffleSampler(50, seed=1)
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert sorted(epoch0) == sorted(epoch1) == list(range(50)) and epoch0 != epoch1
    sampler.set_epoch(0)
    assert list(sampler) == epoch0 == list(EpochShuffleSampler(50, seed=1))
    packs = PackBatchSampler([[0, 1], [2], [3, 4, 5]], seed=0)
    assert sorted(map(tuple, packs)) == [(0, 1), (2,), (3, 4, 5)]
