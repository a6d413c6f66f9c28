"""Distillation uptraining (``--teacher``), its ``--control``, token-count evals and resume rules, on tiny CPU models.

The teacher is a tiny random Llama trained for 40 steps on pydoc text (a random one predicts an
almost uniform distribution, which leaves the KL nothing to teach); the student is that teacher
converted to one KV head with freshly random K/V projections.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hf_flashpatch import distillation
from hf_flashpatch.convert import convert_to_gqa
from hf_flashpatch.train_args import token_counts
from hf_flashpatch.training import TrainArgs, TrainingInputError, train

from tiny_llama import save_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
COMMON = dict(source="pydoc", max_train_docs=12, seq_len=64, batch_size=4, eval_sequences=8, eval_batch_size=8)


@pytest.fixture(scope="module")
def text_cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("text"))


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, text_cache) -> Path:
    folder = tmp_path_factory.mktemp("teacher")
    save_tiny_llama(folder / "init", docs=40, vocab_size=384, hidden=64, heads=4, max_positions=1024)
    train(TrainArgs(model=str(folder / "init"), output_dir=str(folder / "run"), text_cache=text_cache, max_steps=40,
                    lr=1e-2, **COMMON))
    return folder / "run" / "final"


def args_for(source, text_cache, output, **overrides) -> TrainArgs:
    """Distil ``source`` converted to 1 KV head (random K/V) from ``source`` itself, 12 steps."""
    settings = dict(model=str(source), output_dir=str(output), text_cache=text_cache, teacher=str(source),
                    kv_heads=1, convert_method="random", lr=3e-3, max_steps=12) | COMMON
    return TrainArgs(**(settings | overrides))


def heldout_kl(student, teacher_model, ids) -> float:
    with torch.no_grad():
        return distillation.distillation_kl(student(input_ids=ids).logits, teacher_model(input_ids=ids).logits).item()


def test_kl_is_the_definition_zero_for_equal_logits_and_temperature_softens():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 5, 11), torch.randn(2, 5, 11) * 3  # (B, S, V)
    p = teacher.softmax(-1)
    expected = (p * (p.log() - student.log_softmax(-1))).sum(-1).mean()
    assert torch.allclose(distillation.distillation_kl(student, teacher), expected, atol=1e-6)
    assert distillation.distillation_kl(teacher, teacher).abs().item() < 1e-6
    assert distillation.distillation_kl(student, teacher, 4.0) < distillation.distillation_kl(student, teacher)
    with pytest.raises(ValueError, match=r"got \(2, 5, 11\) and \(2, 5, 12\)"):
        distillation.distillation_kl(student, torch.randn(2, 5, 12))
    labels = torch.randint(0, 11, (2, 5))
    reference = torch.nn.functional.cross_entropy(student[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1))
    assert torch.allclose(distillation.next_token_ce(student, labels), reference)


def test_distillation_lowers_the_kl_and_keeps_the_teacher_frozen(teacher, text_cache, tmp_path, monkeypatch):
    seen = []  # (training, grad enabled, dtype, device) at every teacher forward
    load = distillation.load_teacher

    def spy(*args, **kwargs):
        model = load(*args, **kwargs)
        model.register_forward_hook(lambda m, i, o: seen.append(
            (m.training, torch.is_grad_enabled(), o.logits.dtype, o.logits.device.type)))
        seen.append(("weights", {n: p.detach().clone() for n, p in model.named_parameters()}, model))
        return model

    monkeypatch.setattr(distillation, "load_teacher", spy)
    report = train(args_for(teacher, text_cache, tmp_path / "kd", eval_every=12))
    assert report["objective"] == "KL" and report["teacher"] == str(teacher)
    kl = report["loss_parts"]["kl"]
    assert len(kl) == 12 and sum(kl[-3:]) < sum(kl[:3]) / 5, kl
    assert report["losses"] == kl  # --ce-weight 0: the loss is the KL alone
    _, weights, teacher_model = seen.pop(0)
    assert seen and all(call == (False, False, torch.float32, "cpu") for call in seen)
    assert not any(p.requires_grad for p in teacher_model.parameters())
    assert all(torch.equal(p, weights[n]) for n, p in teacher_model.named_parameters())  # never trained

    # On held-out rows: the distilled student is closer to the teacher than it was when converted.
    reference = AutoModelForCausalLM.from_pretrained(teacher).eval()
    converted = convert_to_gqa(AutoModelForCausalLM.from_pretrained(teacher).eval(), 1, method="random")
    distilled = AutoModelForCausalLM.from_pretrained(tmp_path / "kd" / "final").eval()
    assert distilled.config.num_key_value_heads == 1
    ids = torch.randint(0, 384, (4, 64), generator=torch.Generator().manual_seed(0))
    assert heldout_kl(distilled, reference, ids) < heldout_kl(converted, reference, ids) / 2
    assert report["teacher_perplexity"] == pytest.approx(report["evals"][0]["perplexity"], rel=0.05)


def test_ce_weight_adds_cross_entropy(teacher, text_cache, tmp_path):
    report = train(args_for(teacher, text_cache, tmp_path / "kd_ce", ce_weight=0.5, max_steps=3))
    parts = report["loss_parts"]
    assert report["objective"] == "KL + 0.5 CE"
    for loss, kl, ce in zip(report["losses"], parts["kl"], parts["ce"]):
        assert loss == pytest.approx(kl + 0.5 * ce, abs=1e-5)


def test_control_fine_tunes_the_unconverted_model_with_cross_entropy(teacher, text_cache, tmp_path, monkeypatch):
    monkeypatch.setattr(distillation, "load_teacher", lambda *a, **k: pytest.fail("the control loads no teacher"))
    report = train(args_for(teacher, text_cache, tmp_path / "control", control=True, eval_at_tokens=(0,), lr=1e-3))
    assert report["objective"].startswith("ce (control") and report["loss_parts"] == {}
    saved = AutoConfig.from_pretrained(tmp_path / "control" / "final")
    assert saved.num_key_value_heads == AutoConfig.from_pretrained(teacher).num_key_value_heads == 4  # not converted
    monkeypatch.undo()
    distilled = train(args_for(teacher, text_cache, tmp_path / "distilled", max_steps=1))
    assert report["evals"][0]["perplexity"] == pytest.approx(distilled["teacher_perplexity"], rel=1e-6)  # starts there
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "control" / "final").state_dict()
    start = AutoModelForCausalLM.from_pretrained(teacher).state_dict()
    assert final.keys() == start.keys() and not torch.equal(final["model.layers.0.self_attn.k_proj.weight"],
                                                            start["model.layers.0.self_attn.k_proj.weight"])
    log = json.loads((tmp_path / "control" / "eval_log.json").read_text())
    assert log["run"]["control"] and log["run"]["kv_heads"] is None


def test_eval_at_tokens_writes_a_recovery_curve(teacher, text_cache, tmp_path):
    assert token_counts("5e3, 0,1000,1e3") == (0, 1000, 5000)
    report = train(args_for(teacher, text_cache, tmp_path / "curve", max_steps=8, eval_at_tokens=(0, 600, 1024)))
    # 256 tokens per step: 600 is first passed after step 3 (768), 1024 at step 4; the end is step 8.
    assert [(e["step"], e["tokens"]) for e in report["evals"]] == [(0, 0), (3, 768), (4, 1024), (8, 2048)]
    log = json.loads((tmp_path / "curve" / "eval_log.json").read_text())
    assert log["evals"] == report["evals"] and log["teacher_perplexity"] == report["teacher_perplexity"]
    assert log["run"] | {"model": None, "teacher": None} == {
        "model": None, "teacher": None, "kv_heads": 1, "convert_method": "random", "objective": "KL",
        "control": False, "tokens_per_step": 256, "max_steps": 8, "eval_tokens": 8 * 63}


def test_on_step_end_can_end_the_run_early(teacher, text_cache, tmp_path):
    report = train(args_for(teacher, text_cache, tmp_path / "early", eval_every=100), on_step_end=lambda step, loss: step == 5)
    assert report["stopped_early"] and report["steps"] == 5 and not report["interrupted"]
    assert [e["step"] for e in report["evals"]] == [0, 5]  # the end is measured
    assert (tmp_path / "early" / "final" / "config.json").is_file()


def uptrain(argv: list[str], capsys) -> tuple[int, str]:
    """``scripts/uptrain.py`` in this process: (exit status, stderr)."""
    main = runpy.run_path(str(ROOT / "scripts" / "uptrain.py"))["main"]
    capsys.readouterr()  # what came before
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code
    return status, capsys.readouterr().err


def flags(**values) -> list[str]:
    return [part for name, value in values.items() for part in (f"--{name.replace('_', '-')}", str(value))]


def test_resume_with_another_teacher_is_refused_in_one_line(teacher, text_cache, tmp_path, capsys):
    def stop_at_2(step, loss):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the run checkpoints and stops

    first = train(args_for(teacher, text_cache, tmp_path / "run", max_steps=4), on_step_end=stop_at_2)
    assert first["interrupted"] and (tmp_path / "run" / "checkpoint").is_dir()
    other = tmp_path / "other_teacher"
    AutoModelForCausalLM.from_pretrained(teacher).save_pretrained(other)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (other / name).write_bytes((teacher / name).read_bytes())
    common = flags(model=teacher, output_dir=tmp_path / "run", text_cache=text_cache, kv_heads=1,
                   convert_method="random", lr=3e-3, max_steps=4, **COMMON)  # args_for's lr: the first run's
    status, err = uptrain([*common, "--teacher", str(other)], capsys)
    assert status == 2 and err.count("\n") == 1, err
    assert f"--teacher was {teacher}, now {other}" in err and "pass --no-resume" in err
    status, err = uptrain([*common, "--teacher", str(teacher), "--control"], capsys)
    assert status == 2 and "--control was False, now True" in err
    status, err = uptrain([*common, "--teacher", str(teacher)], capsys)  # the same teacher resumes
    assert status == 0, err
    assert json.loads((tmp_path / "run" / "report.json").read_text())["steps"] == 4


@pytest.mark.parametrize("extra, message", [
    (["--ce-weight", "0.5"], "--ce-weight (0.5) and --distill-temperature (1.0) shape the distillation loss: they "
                             "need --teacher"),
    (["--control"], "--control trains the unconverted model: give --teacher"),
    (["--teacher", "/nonexistent/teacher"], "--teacher '/nonexistent/teacher' does not exist"),
    (["--teacher", "{teacher}", "--distill-temperature", "0"], "--distill-temperature > 0, got 0.5 and 0.0"),
    (["--eval-at-tokens", "1e6,lots"], "expected comma-separated token counts such as 0,1e6,5e6, got '1e6,lots'"),
])
def test_bad_objective_arguments_are_one_line_exit_2(teacher, text_cache, tmp_path, capsys, extra, message):
    extra = [part.replace("{teacher}", str(teacher)) for part in extra]
    if "--distill-temperature" in extra:
        extra += ["--ce-weight", "0.5"]
    status, err = uptrain([*flags(model=teacher, output_dir=tmp_path / "bad", text_cache=text_cache, **COMMON),
                           *extra], capsys)
    assert status == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "bad").exists()


def test_a_teacher_with_another_tokenizer_is_refused(teacher, text_cache, tmp_path):
    other = save_tiny_llama(tmp_path / "other", docs=10, vocab_size=384, hidden=64, heads=4, max_positions=1024)
    with pytest.raises(TrainingInputError, match=rf"--teacher: the teacher '{other}' has another tokenizer"):
        train(args_for(teacher, text_cache, tmp_path / "run", teacher=str(other)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_cpu_processes_distil_as_one_does(teacher, text_cache, tmp_path):
    """``accelerate launch``, 2 processes (gloo) with batch 2 each: every process holds its own teacher,
    and the KL, the losses and the held-out curve match one process with batch 4."""
    argv = [*flags(model=teacher, teacher=teacher, kv_heads=1, convert_method="random", lr=3e-3, max_steps=6,
                   eval_at_tokens="0,512", text_cache=text_cache, **(COMMON | {"batch_size": 2})),
            "--output-dir", str(tmp_path / "ddp")]
    env = os.environ | {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                             "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                             "--main_process_port", str(free_port()), "scripts/uptrain.py", *argv],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]
    ddp = json.loads((tmp_path / "ddp" / "report.json").read_text())
    single = train(args_for(teacher, text_cache, tmp_path / "one", max_steps=6, eval_at_tokens=(0, 512)))
    assert ddp["num_processes"] == 2 and ddp["tokens"] == single["tokens"] == 6 * 256
    assert ddp["loss_parts"]["kl"] == pytest.approx(single["loss_parts"]["kl"], rel=2e-2, abs=1e-4)
    assert [e["step"] for e in ddp["evals"]] == [e["step"] for e in single["evals"]] == [0, 2, 6]
    assert ddp["evals"][-1]["perplexity"] == pytest.approx(single["evals"][-1]["perplexity"], rel=1e-3)
    assert ddp["teacher_perplexity"] == pytest.approx(single["teacher_perplexity"], rel=1e-6)
