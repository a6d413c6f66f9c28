"""Training never loses a complete checkpoint, and refuses what it cannot run with one line (exit 2).

Kills are injected at each filesystem step of a checkpoint swap: ``os.replace``/``os.rename`` and
``shutil.rmtree`` on ``OUTPUT/checkpoint*`` raise :class:`SimulatedKill` (a ``BaseException``, so no
``except Exception`` in the code under test can swallow it), optionally after deleting half a
folder, as a SIGKILL during ``rmtree`` does. A rerun must then resume from the newest complete
checkpoint: the same step, the same losses and bit-identical final weights as a run never killed.
One test kills a real subprocess with SIGKILL mid-swap.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_flashpatch import checkpointing
from hf_flashpatch.training import TrainArgs, TrainingInputError, train

from tiny_llama import save_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = dict(source="pydoc", max_train_docs=1, seq_len=32, batch_size=1, lr=3e-3, max_steps=3, save_every=1,
                eval_sequences=1, eval_batch_size=1)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A 2-layer random Llama with a byte-level BPE tokenizer trained on pydoc text: seconds per run."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), docs=20, vocab_size=320, hidden=32, heads=2, max_positions=128)


@pytest.fixture(scope="module")
def text_cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("text"))


def run_args(checkpoint, text_cache, output, **overrides) -> TrainArgs:
    return TrainArgs(model=str(checkpoint), output_dir=str(output), text_cache=text_cache, **(SETTINGS | overrides))


@pytest.fixture(scope="module")
def never_killed(tiny_checkpoint, text_cache, tmp_path_factory) -> tuple[dict, dict]:
    """The report and final weights of the run the killed-and-resumed runs must reproduce."""
    from safetensors.torch import load_file

    output = tmp_path_factory.mktemp("never_killed")
    report = train(run_args(tiny_checkpoint, text_cache, output))
    return report, load_file(output / "final" / "model.safetensors")


class SimulatedKill(BaseException):
    """Stands for SIGKILL: nothing after it in the killed call runs."""


class SwapKiller:
    """Kills the run at the ``nth`` ``kind`` ('rename' or 'rmtree') of a checkpoint folder in the second save.

    ``midway``: an rmtree deletes half the folder's files (sorted, so the weights go first and
    ``trainer_state.json`` stays, as in the reported crash) before the kill.
    """

    def __init__(self, monkeypatch, output: Path, kind: str, nth: int, midway: bool = False):
        self.output, self.kind, self.nth, self.midway = output, kind, nth, midway
        self.armed, self.seen, self.fired = False, 0, None
        for name in ("replace", "rename"):
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name), "rename"))
        monkeypatch.setattr(shutil, "rmtree", self._wrap(shutil.rmtree, "rmtree"))

    def arm(self, step, loss):
        self.armed = step == 2  # the save after step 2 replaces the complete checkpoint of step 1

    def _wrap(self, real, kind):
        def call(path, *args, **kwargs):
            path_ = Path(path)
            if (self.armed and self.fired is None and kind == self.kind and path_.parent == self.output
                    and path_.name.startswith(checkpointing.CHECKPOINT)):
                self.seen += 1
                if self.seen == self.nth:
                    self.fired = f"{kind} {path_.name}"
                    if self.midway:
                        files = sorted(p for p in path_.rglob("*") if p.is_file())
                        for file in files[:len(files) // 2]:
                            file.unlink()
                    raise SimulatedKill(self.fired)
            return real(path, *args, **kwargs)

        return call


def resume_and_compare(args: TrainArgs, never_killed, resumed_step: int) -> None:
    """Rerun ``args``: it must start after ``resumed_step`` and end where the never-killed run ended."""
    from safetensors.torch import load_file

    steps = []
    report = train(args, on_step_end=lambda step, loss: steps.append(step))
    assert steps[0] == resumed_step + 1, f"resumed at step {steps[0] - 1}, expected {resumed_step}"
    expected_report, expected_weights = never_killed
    assert report["losses"] == expected_report["losses"]
    weights = load_file(Path(args.output_dir) / "final" / "model.safetensors")
    assert weights.keys() == expected_weights.keys()
    assert all(torch.equal(weights[k], expected_weights[k]) for k in weights)
    leftovers = sorted(p.name for p in Path(args.output_dir).iterdir() if p.name.startswith("checkpoint"))
    assert leftovers == ["checkpoint"]


@pytest.mark.parametrize("kind, nth, midway", [
    ("rename", 1, False),  # the first rename of the swap
    ("rename", 2, False),  # the second rename of the swap
    ("rmtree", 1, False),  # before deleting the replaced checkpoint
    ("rmtree", 1, True),   # halfway through deleting it: the reported FileNotFoundError on every rerun
], ids=["rename1", "rename2", "rmtree", "rmtree-midway"])
def test_kill_during_checkpoint_swap_resumes_from_the_new_checkpoint(
        tiny_checkpoint, text_cache, never_killed, tmp_path, monkeypatch, kind, nth, midway):
    """The new checkpoint is complete before the swap starts: any kill in the swap resumes at step 2."""
    args = run_args(tiny_checkpoint, text_cache, tmp_path / "run")
    killer = SwapKiller(monkeypatch, tmp_path / "run", kind, nth, midway)
    with pytest.raises(SimulatedKill):
        train(args, on_step_end=killer.arm)
    assert killer.fired, f"the second save made no {nth}th {kind} of a checkpoint folder"
    monkeypatch.undo()
    resume_and_compare(args, never_killed, resumed_step=2)


def test_kill_while_the_new_checkpoint_is_written_resumes_from_the_old_one(
        tiny_checkpoint, text_cache, never_killed, tmp_path, monkeypatch):
    """Killed after accelerate wrote its files but before the checkpoint was marked complete: step 1."""
    from accelerate import Accelerator

    armed = []
    real_save_state = Accelerator.save_state

    def save_state_then_die(self, output_dir=None, **kwargs):
        real_save_state(self, output_dir, **kwargs)
        if armed:
            raise SimulatedKill("after save_state")

    monkeypatch.setattr(Accelerator, "save_state", save_state_then_die)
    args = run_args(tiny_checkpoint, text_cache, tmp_path / "run")
    with pytest.raises(SimulatedKill):
        train(args, on_step_end=lambda step, loss: armed.append(step) if step == 2 else None)
    assert (tmp_path / "run" / "checkpoint.tmp").is_dir()  # the half-made save the rerun must not use
    monkeypatch.undo()
    resume_and_compare(args, never_killed, resumed_step=1)


CHILD = """
import json, os, shutil, signal, sys
from pathlib import Path
from hf_flashpatch.training import TrainArgs, train

real_rmtree, armed = shutil.rmtree, []

def rmtree(path, *args, **kwargs):
    if armed and Path(path).name.startswith("checkpoint"):  # halfway through, as a kill would find it
        files = sorted(p for p in Path(path).rglob("*") if p.is_file())
        for file in files[:len(files) // 2]:
            file.unlink()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_rmtree(path, *args, **kwargs)

shutil.rmtree = rmtree
train(TrainArgs(**json.loads(sys.argv[1])), on_step_end=lambda step, loss: armed.append(step) if step == 2 else None)
"""


def test_real_sigkill_mid_swap_resumes_from_the_new_checkpoint(tiny_checkpoint, text_cache, never_killed, tmp_path):
    args = run_args(tiny_checkpoint, text_cache, tmp_path / "run")
    env = os.environ | {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args.__dict__)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    resume_and_compare(args, never_killed, resumed_step=2)


def sealed(folder: Path, step: int) -> Path:
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"w" * 64)
    (folder / checkpointing.STATE_FILE).write_text(json.dumps({"step": step}))
    checkpointing.seal(folder)
    return folder


def test_recover_keeps_the_newest_complete_checkpoint_and_deletes_leftovers(tmp_path):
    sealed(tmp_path / "checkpoint", 1)
    (tmp_path / "checkpoint.tmp").mkdir()  # a save killed before it was sealed
    (tmp_path / "checkpoint.tmp" / "optimizer.bin").write_bytes(b"half")
    old = sealed(tmp_path / "checkpoint.old", 0)
    (old / "model.safetensors").unlink()  # a deletion cut short (its manifest would have gone first)
    assert checkpointing.recover(tmp_path) == tmp_path / "checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    assert checkpointing.read_state(tmp_path / "checkpoint")["step"] == 1

    sealed(tmp_path / "checkpoint.tmp", 2)  # killed after sealing, before the swap began: the newest
    assert checkpointing.recover(tmp_path) == tmp_path / "checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    assert checkpointing.read_state(tmp_path / "checkpoint")["step"] == 2

    os.replace(tmp_path / "checkpoint", tmp_path / "checkpoint.old")  # killed between the two renames
    assert checkpointing.recover(tmp_path) == tmp_path / "checkpoint"
    assert checkpointing.read_state(tmp_path / "checkpoint")["step"] == 2


def test_manifest_rejects_missing_or_truncated_files(tmp_path):
    folder = sealed(tmp_path / "checkpoint", 1)
    assert checkpointing.is_complete(folder)
    (folder / "model.safetensors").write_bytes(b"w" * 10)
    assert not checkpointing.is_complete(folder)
    (folder / "model.safetensors").unlink()
    assert not checkpointing.is_complete(folder)
    (folder / checkpointing.MANIFEST).write_text("{not json")
    assert not checkpointing.is_complete(folder)
    assert checkpointing.recover(tmp_path) is None
    assert folder.is_dir()  # an unverifiable checkpoint/ is reported by the caller, never deleted silently


def test_resume_refuses_an_unverified_checkpoint(tiny_checkpoint, text_cache, tmp_path):
    (tmp_path / "run" / "checkpoint").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint" / checkpointing.STATE_FILE).write_text('{"step": 5}')
    with pytest.raises(TrainingInputError, match=r"checkpoint: it has no valid COMPLETE manifest.*--no-resume"):
        train(run_args(tiny_checkpoint, text_cache, tmp_path / "run"))


@pytest.mark.parametrize("changed, message", [
    ({"seq_len": 16}, "--seq-len was 32, now 16"),
    ({"batch_size": 2}, "--batch-size was 1, now 2"),
    ({"max_train_docs": 2}, "--max-train-docs was 1, now 2"),  # other batches
    ({"lr": 1e-3}, "--lr was 0.003, now 0.001"),  # the optimizer state would keep the old one without a word
    ({"trainable": "attention"}, "--trainable was all, now attention"),
])
def test_resume_with_other_shape_is_refused(tiny_checkpoint, text_cache, tmp_path, changed, message):
    output = tmp_path / "run"
    train(run_args(tiny_checkpoint, text_cache, output, max_steps=1))
    with pytest.raises(TrainingInputError, match=message):
        train(run_args(tiny_checkpoint, text_cache, output, max_steps=2, **changed))
    train(run_args(tiny_checkpoint, text_cache, output, max_steps=1, resume=False, **changed))  # starting over is fine


def uptrain_main():
    return runpy.run_path(str(ROOT / "scripts" / "uptrain.py"))["main"]


def run_uptrain(argv, capsys) -> str:
    """Run ``scripts/uptrain.py`` in-process; it must exit 2 with one error line, and no traceback, on stderr.

    Errors found after the model loads come after its progress bars; the error is still one line.
    """
    with pytest.raises(SystemExit) as exit_info:
        uptrain_main()(argv)
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2, (out, err)
    lines = err.strip().splitlines()
    assert "Traceback" not in err and [line for line in lines if "error" in line] == lines[-1:], err
    return lines[-1]


def test_script_refuses_resume_with_another_seq_len(tiny_checkpoint, text_cache, tmp_path, capsys):
    output = tmp_path / "run"
    train(run_args(tiny_checkpoint, text_cache, output, max_steps=1))
    capsys.readouterr()
    line = run_uptrain(["--model", str(tiny_checkpoint), "--output-dir", str(output), "--source", "pydoc",
                        "--text-cache", text_cache, "--seq-len", "16", "--batch-size", "1", "--max-steps", "2"],
                       capsys)
    assert "--seq-len was 32, now 16" in line and "--no-resume" in line


@pytest.mark.parametrize("case", ["grad-accum-0", "empty-data", "non-utf8-data", "blank-data", "one-document",
                                  "missing-model", "model-without-config", "model-omitted", "negative-clip-norm",
                                  "lr-0", "bad-scheduler", "bad-backend", "output-is-a-file", "kv-heads-3"])
def test_script_input_errors_are_one_line_exit_2(tiny_checkpoint, tmp_path, capsys, case):
    data = tmp_path / "data.txt"
    data.write_text("first document\n\nsecond document\n")
    argv = ["--model", str(tiny_checkpoint), "--output-dir", str(tmp_path / "run"), "--data", str(data)]
    expected = {
        "grad-accum-0": "--grad-accum must be >= 1, got 0",
        "empty-data": f"--data: {data} is empty",
        "non-utf8-data": f"--data: {data} is not UTF-8 text: invalid start byte at byte 6",
        "blank-data": f"--data: {data} holds only blank lines",
        "one-document": f"--data: {data} holds only one document",
        "missing-model": f"--model '{tmp_path / 'nowhere'}' does not exist",
        "model-without-config": f"--model '{tmp_path}' is not a model checkpoint: it has no config.json",
        "model-omitted": "the following arguments are required: --model",
        # a negative norm flipped every gradient: the run climbed the loss and exited 0
        "negative-clip-norm": "--max-grad-norm must be >= 0 (0: no clipping), got -1.0",
        "lr-0": "--lr must be > 0, got 0.0",
        "bad-scheduler": "--lr-scheduler must be one of linear, cosine",
        "bad-backend": "--attn-implementation must be one of hfpatch, eager",
        "output-is-a-file": "is a file; give a folder",
        "kv-heads-3": "--kv-heads 3: ",  # after the model loads: 3 does not divide its KV heads
    }[case]
    flags = {"negative-clip-norm": ["--max-grad-norm", "-1"], "lr-0": ["--lr", "0"],
             "bad-scheduler": ["--lr-scheduler", "bogus"], "bad-backend": ["--attn-implementation", "bogus"],
             "kv-heads-3": ["--kv-heads", "3", "--convert-method", "mean", "--seq-len", "4", "--batch-size", "1"]}
    argv += flags.get(case, [])
    if case == "output-is-a-file":
        (tmp_path / "run").write_text("not a folder")
    if case == "grad-accum-0":
        argv += ["--grad-accum", "0", "--seq-len", "4", "--batch-size", "1"]  # enough rows for the old crash
    elif case == "empty-data":
        data.write_bytes(b"")
    elif case == "non-utf8-data":
        data.write_bytes(b"hello \xff\xfe world\n")
    elif case == "blank-data":
        data.write_text("\n\n   \n")
    elif case == "one-document":
        data.write_text("one document, no blank line in it\n")
    elif case == "missing-model":
        argv[1] = str(tmp_path / "nowhere")
    elif case == "model-without-config":
        argv[1] = str(tmp_path)
    elif case == "model-omitted":
        argv = argv[2:]
    if case == "model-omitted":  # argparse's own error: a usage line, then the error line
        with pytest.raises(SystemExit) as exit_info:
            uptrain_main()(argv)
        assert exit_info.value.code == 2 and expected in capsys.readouterr().err
        return
    assert expected in run_uptrain(argv, capsys)


@pytest.mark.parametrize("script", ["uptrain.py", "finetune_long.py"])
def test_an_interrupted_run_exits_130_not_0(tiny_checkpoint, text_cache, tmp_path, monkeypatch, script):
    """A job runner (``uptrain.py ... && use final/``) must not take a stopped run for a finished one."""
    import hf_flashpatch.training

    real = hf_flashpatch.training.train

    def interrupted_at_step_1(args, **kwargs):
        def stop(step, loss):
            if step == 1:
                os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does; the loop stops at the step boundary

        return real(args, on_step_end=stop)

    monkeypatch.setattr(hf_flashpatch.training, "train", interrupted_at_step_1)
    main = runpy.run_path(str(ROOT / "scripts" / script))["main"]
    argv = ["--model", str(tiny_checkpoint), "--output-dir", str(tmp_path / "run"), "--source", "pydoc",
            "--text-cache", text_cache, "--max-train-docs", "1", "--seq-len", "32", "--batch-size", "1",
            "--max-steps", "3", "--eval-sequences", "1", "--eval-batch-size", "1"]
    assert main(argv) == 130
    assert (tmp_path / "run" / "checkpoint").is_dir() and not (tmp_path / "run" / "final").exists()
    monkeypatch.setattr(hf_flashpatch.training, "train", real)
    assert runpy.run_path(str(ROOT / "scripts" / script))["main"](argv) == 0  # the rerun resumes and finishes
    assert (tmp_path / "run" / "final").is_dir()


# ------------------------------------------------------------------ found by the 2026-12-05 review


@pytest.fixture(scope="module")
def dropout_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny Llama with attention dropout 0.2 (trained with the eager backend: ours has no dropout)."""
    out = tmp_path_factory.mktemp("tiny_dropout")
    shutil.copytree(tiny_checkpoint, out, dirs_exist_ok=True)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"attention_dropout": 0.2}))
    return out


def test_a_run_with_dropout_resumed_mid_epoch_matches_one_never_killed(dropout_checkpoint, text_cache, tmp_path):
    """The loader's iterator, made after the restored RNG state, drew its seed from the global generator: the
    dropout masks after a resume differed from the uninterrupted run's (losses apart from the first step on)."""
    from safetensors.torch import load_file

    settings = dict(attn_implementation="eager", max_train_docs=4, max_steps=6)
    reference = train(run_args(dropout_checkpoint, text_cache, tmp_path / "whole", **settings))
    args = run_args(dropout_checkpoint, text_cache, tmp_path / "run", **settings)

    def kill_at_step_4(step, loss):
        if step == 4:  # the checkpoint of step 3 is the resume point
            raise SimulatedKill("step 4")

    with pytest.raises(SimulatedKill):
        train(args, on_step_end=kill_at_step_4)
    steps = []
    resumed = train(args, on_step_end=lambda step, loss: steps.append(step))
    assert steps[0] == 4 and resumed["losses"] == reference["losses"]
    whole, again = load_file(tmp_path / "whole" / "final" / "model.safetensors"), \
        load_file(tmp_path / "run" / "final" / "model.safetensors")
    assert all(torch.equal(whole[k], again[k]) for k in whole)


def test_a_kill_while_final_is_written_leaves_the_previous_final_whole(tiny_checkpoint, text_cache, tmp_path,
                                                                     monkeypatch):  # fmt: skip
    """final/ was written in place: a kill mid-save left truncated weights (or old and new shards mixed) that
    from_pretrained read, beside a report.json of the earlier run."""
    from safetensors.torch import load_file
    from transformers import PreTrainedModel

    output = tmp_path / "run"
    first = train(run_args(tiny_checkpoint, text_cache, output, max_steps=2))
    before = load_file(output / "final" / "model.safetensors")
    real_save = PreTrainedModel.save_pretrained

    def save_half_then_die(self, folder, *args, **kwargs):
        real_save(self, folder, *args, **kwargs)
        weights = Path(folder) / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        raise SimulatedKill("mid weights")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", save_half_then_die)
    with pytest.raises(SimulatedKill):
        train(run_args(tiny_checkpoint, text_cache, output, max_steps=3))  # resumes at 2, trains step 3, saves
    monkeypatch.undo()
    after = load_file(output / "final" / "model.safetensors")  # readable: the previous final, whole
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert json.loads((output / "report.json").read_text())["steps"] == first["steps"] == 2
    assert (output / "final" / "tokenizer.json").is_file()
    report = train(run_args(tiny_checkpoint, text_cache, output, max_steps=3))  # the rerun finishes the job
    assert report["steps"] == 3 and json.loads((output / "report.json").read_text())["steps"] == 3


def test_starting_over_sets_the_previous_runs_results_aside(tiny_checkpoint, text_cache, tmp_path):
    """--no-resume left the old final/ and report.json beside the new run's checkpoint: a finished-looking folder."""
    output = tmp_path / "run"
    train(run_args(tiny_checkpoint, text_cache, output, max_steps=2))

    def stop_at_once(step, loss):
        raise SimulatedKill("step 1")

    with pytest.raises(SimulatedKill):
        train(run_args(tiny_checkpoint, text_cache, output, max_steps=2, resume=False, seed=1), on_step_end=stop_at_once)
    assert not (output / "final").exists() and not (output / "report.json").exists()
    previous = output / "previous_run"
    assert json.loads((previous / "report.json").read_text())["steps"] == 2
    assert (previous / "final" / "model.safetensors").is_file()
    # the previous run's final/ as the model to go on from, in the same folder: loaded before it is set aside
    args = run_args(previous / "final", text_cache, output, max_steps=1, resume=False)
    train(run_args(tiny_checkpoint, text_cache, output, max_steps=1, resume=False))  # a final/ again
    args = run_args(output / "final", text_cache, output, max_steps=1, resume=False)
    report = train(args)
    assert report["steps"] == 1 and (output / "final" / "model.safetensors").is_file()
    assert (output / "previous_run" / "final" / "model.safetensors").is_file()


@pytest.mark.parametrize("failure", ["ENOSPC", "torch zip writer"])
def test_a_full_disk_is_one_line_naming_the_path(tiny_checkpoint, text_cache, tmp_path, monkeypatch, capsys, failure):
    """A full disk ended the run in a two-part traceback ('unexpected pos 499648 vs 499536'), no path, no cause."""
    import errno

    from accelerate import Accelerator

    from hf_flashpatch import run_outputs

    def full(self, output_dir=None, **kwargs):
        if failure == "ENOSPC":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 499648 vs 499536")

    monkeypatch.setattr(Accelerator, "save_state", full)
    monkeypatch.setattr(run_outputs, "_free_bytes", lambda path: 12 * 2**20)
    output = tmp_path / "run"
    line = run_uptrain(["--model", str(tiny_checkpoint), "--output-dir", str(output), "--source", "pydoc",
                        "--text-cache", text_cache, "--max-train-docs", "1", "--seq-len", "32", "--batch-size", "1",
                        "--max-steps", "2", "--save-every", "1", "--eval-sequences", "1", "--eval-batch-size", "1"],
                       capsys)  # fmt: skip
    assert f"cannot write {output / 'checkpoint'}: no space left on the device (12 MiB free)" in line
    assert "rerun to resume" in line
