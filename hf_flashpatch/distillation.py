"""Distillation uptraining: the converted student learns the unconverted teacher's next-token distributions.

After a GQA/MQA conversion, the model the student should become is known exactly: the checkpoint it
was converted from. Training on its logits (Hinton et al. 2015) gives every position a full target
distribution instead of one observed token, so the student recovers on fewer tokens than with
cross-entropy, and recovers *that* model rather than drifting towards the training text.

The loss per token is ``T² · KL(p_teacher || p_student)`` on logits divided by the temperature ``T``,
averaged over every position of the batch, plus ``ce_weight`` times the usual next-token cross-entropy
(:class:`Distillation`). The teacher's logits are computed on the fly from the same batch: the teacher
is frozen, in eval mode, run without gradients, in the student's dtype and on the student's device,
under the same autocast as the student (``accelerator.autocast``). Under ``accelerate launch`` every
process holds its own whole copy of the teacher; it is not wrapped by DDP/FSDP (it has no gradients
to reduce) and not checkpointed: a checkpoint names it, and a resume reloads it (and refuses another).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.nn.functional as F

__all__ = ["Distillation", "check_same_tokenizer", "distillation_kl", "from_args", "load_teacher", "next_token_ce",
           "objective_name", "teacher_id"]


def teacher_id(teacher: str | None) -> str | None:
    """What a checkpoint records of ``--teacher``: ``smollm2``, or the folder's absolute path."""
    if teacher is None or teacher == "smollm2":
        return teacher
    return str(Path(teacher).resolve())


def distillation_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Mean over positions of ``KL(softmax(teacher / T) || softmax(student / T))``, in float32.

    Both logits are ``(..., V)``; every position counts (no label is needed to compare distributions).
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student and teacher logits differ in shape: got {tuple(student_logits.shape)} and "
                         f"{tuple(teacher_logits.shape)} (do they share a vocabulary?)")
    student, teacher = student_logits.float(), teacher_logits.float()
    if temperature != 1.0:
        student, teacher = student / temperature, teacher / temperature
    vocab = student.shape[-1]
    log_student = F.log_softmax(student, dim=-1).reshape(-1, vocab)  # (N, V)
    log_teacher = F.log_softmax(teacher, dim=-1).reshape(-1, vocab)  # (N, V)
    return F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean")  # sum / N positions


def next_token_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, as transformers' causal-LM loss: position ``t`` predicts ``labels[t + 1]``."""
    predicted = logits[:, :-1].float().flatten(0, 1)  # (B·(S-1), V)
    return F.cross_entropy(predicted, labels[:, 1:].flatten(), ignore_index=-100)


class Distillation:
    """The distillation objective: ``loss = T² · KL + ce_weight · CE`` (see the module docstring).

    ``autocast``: a context manager factory the teacher runs under (``accelerator.autocast``), so that
    under mixed precision it computes as the student does.
    """

    def __init__(self, teacher: torch.nn.Module, *, temperature: float = 1.0, ce_weight: float = 0.0,
                 autocast=contextlib.nullcontext):
        if temperature <= 0 or ce_weight < 0:
            raise ValueError(f"temperature must be > 0 and ce_weight >= 0, got {temperature} and {ce_weight}")
        self.teacher = teacher.eval().requires_grad_(False)
        self.temperature, self.ce_weight, self.autocast = temperature, ce_weight, autocast

    def teacher_logits(self, inputs: dict) -> torch.Tensor:
        with torch.no_grad(), self.autocast():
            return self.teacher(**inputs).logits  # (B, S, V)

    def __call__(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, {"kl": ..., "ce": ...})`` for one batch; the parts are detached, for logging."""
        inputs = {name: value for name, value in batch.items() if name != "labels"}
        student = model(**inputs).logits  # (B, S, V)
        kl = distillation_kl(student, self.teacher_logits(inputs), self.temperature)
        loss = self.temperature ** 2 * kl
        if self.ce_weight > 0:
            ce = next_token_ce(student, batch["labels"])
            loss = loss + self.ce_weight * ce
        else:
            with torch.no_grad():  # logged only: no graph kept for it
                ce = next_token_ce(student, batch["labels"])
        return loss, {"kl": kl.detach(), "ce": ce.detach()}


def check_same_tokenizer(student_tokenizer, teacher_tokenizer, teacher: str) -> None:
    """Raise ValueError unless both tokenizers map the same strings to the same ids (logits must align)."""
    student_vocab, teacher_vocab = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if student_vocab != teacher_vocab:
        raise ValueError(f"the teacher {teacher!r} has another tokenizer than the student ({len(teacher_vocab)} vs "
                         f"{len(student_vocab)} tokens, or other ids): its logits would not line up")


def load_teacher(teacher: str, *, student, student_tokenizer, attn_implementation: str, device):
    """The frozen teacher (``smollm2`` or a checkpoint folder) in the student's dtype on ``device``."""
    from .models import load_model_and_tokenizer

    dtype = next(student.parameters()).dtype
    model, tokenizer = load_model_and_tokenizer(None if teacher == "smollm2" else teacher, dtype=dtype,
                                                attn_implementation=attn_implementation, device=device)
    check_same_tokenizer(student_tokenizer, tokenizer, teacher)
    if model.config.vocab_size != student.config.vocab_size:
        raise ValueError(f"the teacher {teacher!r} has vocab_size {model.config.vocab_size}, the student "
                         f"{student.config.vocab_size}: their logits would not line up")
    model.config.use_cache = False
    return model.eval().requires_grad_(False)


def from_args(args, model, tokenizer, attn_implementation: str, accelerator) -> Distillation | None:
    """The objective a run's ``TrainArgs`` ask for, its teacher loaded: None means plain cross-entropy
    (no ``teacher``, or ``control``, which trains the unconverted model itself)."""
    if args.teacher is None or args.control:
        return None
    teacher = load_teacher(args.teacher, student=model, student_tokenizer=tokenizer,
                           attn_implementation=attn_implementation, device=accelerator.device)
    return Distillation(teacher, temperature=args.distill_temperature, ce_weight=args.ce_weight,
                        autocast=accelerator.autocast)


def objective_name(args) -> str:
    """``ce``, ``ce (control: ...)``, ``KL``, ``KL + 0.5 CE``, ``4 KL(T=2) + ...``: for reports and logs."""
    if args.teacher is None or args.control:
        return "ce (control: the unconverted model)" if args.control else "ce"
    t = args.distill_temperature
    kl = "KL" if t == 1 else f"{t * t:g} KL(T={t:g})"
    return kl + (f" + {args.ce_weight:g} CE" if args.ce_weight else "")
