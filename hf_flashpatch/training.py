"""The training loop ``scripts/uptrain.py`` and ``scripts/finetune_long.py`` share.

Runs under ``accelerate launch`` (one process, DDP or FSDP over N GPUs, or ``--cpu`` processes) and
plain ``python``. Data comes from :mod:`hf_flashpatch.text_data`; two packings:

- ``fixed``: documents concatenated and cut into rows of ``seq_len`` tokens (uptraining);
- ``flatten``: whole documents packed into one row of up to ``seq_len`` tokens per step by
  ``DataCollatorWithFlattening`` (restarting position ids, ``cu_seq_lens``; no padding, no N x N
  mask): long-context fine-tuning.

Resuming loses nothing: the checkpoint (``OUTPUT/checkpoint``, swapped in so that a kill at any point
leaves a complete one: :mod:`hf_flashpatch.checkpointing`) holds the model, optimizer, scheduler and
RNG states (``accelerator.save_state``) and ``trainer_state.json`` with the step, so the data position
is recomputed (the data order is a pure function of seed and epoch). A resume with settings that
change what a step means (``--seq-len``, ``--batch-size``, ...) is refused. SIGINT/SIGTERM set a flag;
the loop stops at the next step boundary, all processes agree on it, and it writes a checkpoint first.

The objective is next-token cross-entropy or, with ``teacher``, distillation from the unconverted
model's logits (:mod:`hf_flashpatch.distillation`); ``control`` trains the unconverted model with
cross-entropy instead. A checkpoint names the objective and teacher (whose weights a resume reloads)
and a resume with another is refused. Held-out perplexity is measured at step 0, every ``eval_every``
steps, once each ``eval_at_tokens`` count is passed and at the end, each time rewriting
``OUTPUT/eval_log.json``, so an interrupted run keeps its recovery curve.

Arguments, the model folder and the data files are checked before anything loads: a problem raises
:class:`TrainingInputError`, which the scripts print as one line (exit status 2).
"""

from __future__ import annotations

import math
import resource
import signal
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from . import checkpointing, distillation, run_outputs, text_data
from .data_order import EpochShuffleSampler, PackBatchSampler, make_train_loader, own_generator, stack_rows  # noqa: F401
from .run_outputs import TrainingOutputError
from .train_args import TrainArgs, TrainingInputError, add_train_arguments, check_args

__all__ = ["TrainArgs", "TrainingInputError", "TrainingOutputError", "add_train_arguments", "check_args",
           "evaluate_perplexity", "resolve_attn_implementation", "train"]

# Which parameters train (names contain ".<part>."); None = all of them.
TRAINABLE = {"all": None, "attention": ("q_proj", "k_proj", "v_proj", "o_proj"), "kv": ("k_proj", "v_proj")}


def resolve_attn_implementation(requested: str) -> str:
    """``requested``, unless it is the plugin's name and the backend is not registered: then ``sdpa``.

    The fallback is announced with a warning; it exists only for installs whose transformers is too
    old for the backend to register.
    """
    import hf_flashpatch
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if requested == hf_flashpatch.ATTN_NAME and requested not in ALL_ATTENTION_FUNCTIONS:
        warnings.warn(f"attention backend {requested!r} is not registered with transformers; using 'sdpa'")
        return "sdpa"
    return requested


@dataclass
class _State:
    step: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    losses: list = field(default_factory=list)
    evals: list = field(default_factory=list)  # [{"step", "tokens", "perplexity"}]
    loss_parts: dict = field(default_factory=dict)  # distillation: {"kl": [...], "ce": [...]} per step
    teacher_perplexity: float | None = None
    settings: dict = field(default_factory=dict)  # what a step means; a resume must not change it


# The scripts' exit status when SIGINT/SIGTERM stopped the run after its checkpoint (128 + SIGINT, as the
# converter's): a job runner must not take the run for finished.
INTERRUPTED = 130

# Labels for the run settings a resume must keep: they fix which batches a saved step consumed.
SETTING_LABELS = {"seq_len": "--seq-len", "batch_size": "--batch-size", "grad_accum": "--grad-accum",
                  "packing": "--packing", "seed": "--seed", "num_processes": "the number of processes",
                  "data": "--data", "source": "--source", "max_train_docs": "--max-train-docs"}
# ... and the objective and what is trained: the saved weights and optimizer state were trained towards it, in the
# saved shapes (--kv-heads) and parameter groups (--trainable); the optimizer state also carries the learning rate and
# weight decay, which would override new ones without a word.
OBJECTIVE_LABELS = {"teacher": "--teacher", "control": "--control", "ce_weight": "--ce-weight",
                    "distill_temperature": "--distill-temperature", "kv_heads": "--kv-heads",
                    "trainable": "--trainable", "lr": "--lr", "weight_decay": "--weight-decay"}


def _run_settings(args: TrainArgs, num_processes: int) -> dict:
    settings = {name: num_processes if name == "num_processes" else getattr(args, name) for name in SETTING_LABELS}
    if args.data is not None and Path(args.data).exists():
        settings["data"] = str(Path(args.data).resolve())  # one file however the path is spelled
    return settings | {name: getattr(args, name) for name in OBJECTIVE_LABELS} | {
        "teacher": distillation.teacher_id(args.teacher)}


def _changed(saved: dict, settings: dict, labels: dict) -> list[str]:
    return [f"{label} was {saved[name]}, now {settings[name]}" for name, label in labels.items()
            if name in saved and saved[name] != settings[name]]


def _resume_point(args: TrainArgs, accelerator, output: Path, settings: dict) -> Path | None:
    """The checkpoint to resume from, after recovering from a save a kill cut short; None: start at step 0.

    Refuses a checkpoint saved with other ``settings``: its step would point at the wrong batches.
    """
    if accelerator.is_main_process and output.is_dir():
        checkpointing.recover(output)
    accelerator.wait_for_everyone()
    checkpoint = output / checkpointing.CHECKPOINT
    if not args.resume or not checkpoint.exists():
        return None
    if not checkpointing.is_complete(checkpoint):
        raise TrainingInputError(
            f"cannot resume from {checkpoint}: it has no valid {checkpointing.MANIFEST} manifest (written by an "
            "older hf_flashpatch, or altered); pass --no-resume to start over (the first save replaces it)")
    saved = checkpointing.read_state(checkpoint).get("settings", {})
    changed = _changed(saved, settings, SETTING_LABELS)
    if changed:
        raise TrainingInputError(
            f"cannot resume from {checkpoint} with other settings ({'; '.join(changed)}): its step counts "
            "batches of the saved settings; rerun with those, or pass --no-resume to start over")
    changed = _changed(saved, settings, OBJECTIVE_LABELS)
    if changed:
        raise TrainingInputError(
            f"cannot resume from {checkpoint} with another objective ({'; '.join(changed)}): it was trained "
            "towards the saved one; rerun with that, or pass --no-resume to start over")
    return checkpoint


def _load_model(args: TrainArgs, attn_implementation: str):
    from .models import load_model_and_tokenizer

    # --control trains the unconverted model: the teacher when one is named, else --model unconverted.
    source = args.teacher if args.control and args.teacher is not None else args.model
    model, tokenizer = load_model_and_tokenizer(None if source == "smollm2" else source,
                                                attn_implementation=attn_implementation)
    if args.kv_heads is not None and not args.control:
        from .convert import convert_to_gqa

        try:
            model, report = convert_to_gqa(model, args.kv_heads, method=args.convert_method, seed=args.seed,
                                           return_report=True, tokenizer=tokenizer)
        except ValueError as error:  # --kv-heads that does not divide the model's KV heads
            raise TrainingInputError(f"--kv-heads {args.kv_heads}: {error}") from None
        print(report.summary())
    if args.trainable not in TRAINABLE:
        raise ValueError(f"trainable must be one of {tuple(TRAINABLE)}, got {args.trainable!r}")
    if TRAINABLE[args.trainable] is not None:
        for name, param in model.named_parameters():
            param.requires_grad_(any(f".{part}." in name for part in TRAINABLE[args.trainable]))
    model.config.use_cache = False
    if args.gradient_checkpointing:
        # Newer transformers rename gradient_checkpointing_enable (and its kwargs argument).
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train(), tokenizer


def _datasets(args: TrainArgs, tokenizer, accelerator):
    with accelerator.main_process_first():
        try:
            splits = text_data.load_text_splits(args.data, eval_data=args.eval_data, cache_dir=args.text_cache,
                                                source=args.source)
        except text_data.TextDataError as error:
            raise TrainingInputError(f"--data: {error}") from None
        train_docs = splits["train"]
        if args.max_train_docs is not None:
            train_docs = train_docs.select(range(min(args.max_train_docs, len(train_docs))))
        train_tok = text_data.tokenize_documents(train_docs, tokenizer)
        eval_tok = text_data.tokenize_documents(splits["eval"], tokenizer)
    try:
        eval_rows = text_data.pack_fixed_length(eval_tok, args.eval_seq_len or args.seq_len,
                                                max_sequences=args.eval_sequences)
    except text_data.TextDataError as error:
        raise TrainingInputError(f"eval data: {error}; give more eval text or a smaller --eval-seq-len") from None
    if args.packing == "fixed":
        try:
            train = text_data.pack_fixed_length(train_tok, args.seq_len)
        except text_data.TextDataError as error:
            raise TrainingInputError(f"training data: {error}; give more text (--data, --max-train-docs) "
                                     "or a smaller --seq-len") from None
    else:
        train = text_data.split_long_documents(train_tok, args.seq_len)
    return train, eval_rows


@torch.no_grad()
def evaluate_perplexity(model, loader, accelerator=None) -> float:
    """exp(mean next-token NLL) over every predicted token of ``loader``.

    Per-row sums go through ``gather_for_metrics``, which drops the rows accelerate repeats to give
    every process the same number of batches, so N processes measure exactly what one does.
    """
    was_training = model.training
    model.eval()
    device = accelerator.device if accelerator is not None else next(model.parameters()).device
    total_nll, total_tokens = 0.0, 0
    for batch in loader:
        labels = batch["labels"].to(device)[:, 1:]  # (B, S-1): next-token targets
        logits = model(input_ids=batch["input_ids"].to(device)).logits[:, :-1]  # (B, S-1, V)
        nll = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100,
                                                reduction="none")  # (B, S-1)
        row_nll, row_tokens = nll.sum(dim=1).double(), (labels != -100).sum(dim=1)  # (B,), (B,)
        if accelerator is not None:
            row_nll, row_tokens = accelerator.gather_for_metrics((row_nll, row_tokens))
        total_nll += row_nll.sum().item()
        total_tokens += int(row_tokens.sum().item())
    model.train(was_training)
    return math.exp(total_nll / total_tokens)


def _peak_memory_bytes(device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB: process peak RSS


class _StopFlag:
    """SIGINT/SIGTERM ask for a clean stop at the next step boundary; a second SIGINT interrupts at once."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave the handlers alone
                pass
        return self

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _steps_for(args: TrainArgs, tokens_per_step: int, steps_per_epoch: int) -> int:
    budget = args.token_budget
    if budget is None and args.token_fraction is not None:  # check_args saw --pretrain-tokens set
        budget = int(args.token_fraction * args.pretrain_tokens)
    if budget is not None:
        return max(1, math.ceil(budget / tokens_per_step))
    if args.max_steps is not None:
        return args.max_steps
    return steps_per_epoch * args.epochs


def _eval_due(args: TrainArgs, step: int, max_steps: int, tokens_before: int, tokens: int) -> bool:
    """Whether to measure after the step that took the token count from ``tokens_before`` to ``tokens``."""
    if not (args.eval_every or args.eval_at_tokens):
        return False
    if step == max_steps or (args.eval_every and step % args.eval_every == 0):
        return True
    return any(tokens_before < point <= tokens for point in args.eval_at_tokens or ())


def _write_eval_log(output: Path, run: dict, state: _State) -> None:
    """``OUTPUT/eval_log.json``: the run and every held-out measurement so far (renamed into place whole)."""
    output.mkdir(parents=True, exist_ok=True)
    run_outputs.write_json(output / "eval_log.json",
                           {"run": run, "teacher_perplexity": state.teacher_perplexity, "evals": state.evals})


def train(args: TrainArgs, *, on_step_end=None) -> dict:
    """Train per ``args``; returns the report (also written to ``OUTPUT/report.json``).

    ``on_step_end(step, loss)`` is called on every process after each optimizer step; when it returns
    true (on any process), the run ends after that step as if its budget were spent (final eval and
    save; ``report["stopped_early"]``). Raises :class:`TrainingInputError` when the arguments, model,
    data, teacher or checkpoint cannot serve the run.
    """
    check_args(args)
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from transformers import get_scheduler

    # Without a GPU, processes started by `accelerate launch --multi_gpu` (torchrun) must ask for CPU
    # explicitly, or each one silently trains alone (world size 1) instead of joining a gloo group.
    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum, mixed_precision=args.mixed_precision,
                              cpu=args.cpu or not torch.cuda.is_available())
    set_seed(args.seed)
    output = Path(args.output_dir)
    settings = _run_settings(args, accelerator.num_processes)
    resume_from = _resume_point(args, accelerator, output, settings)
    attn = resolve_attn_implementation(args.attn_implementation)
    model, tokenizer = _load_model(args, attn)
    try:
        objective = distillation.from_args(args, model, tokenizer, attn, accelerator)
    except ValueError as error:  # a teacher whose vocabulary does not match the student's
        raise TrainingInputError(f"--teacher: {error}") from None
    train_rows, eval_rows = _datasets(args, tokenizer, accelerator)
    train_loader, order = make_train_loader(args, train_rows)
    eval_loader = DataLoader(eval_rows, batch_size=args.eval_batch_size, collate_fn=stack_rows,
                             generator=own_generator(args.seed))

    world = accelerator.num_processes
    steps_per_epoch = len(train_loader) // world // args.grad_accum
    if steps_per_epoch < 1:
        raise TrainingInputError(f"{len(train_loader)} batches cannot fill one step of {world} processes x "
                                 f"{args.grad_accum} accumulation; use more data or a smaller --batch-size/--seq-len")
    tokens_per_step = args.seq_len * (args.batch_size if args.packing == "fixed" else 1) * args.grad_accum * world
    max_steps = _steps_for(args, tokens_per_step, steps_per_epoch)

    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    warmup = args.warmup_steps if args.warmup_steps is not None else int(0.05 * max_steps)
    # accelerate steps a prepared scheduler once per process per optimizer step: scale by the world size.
    scheduler = get_scheduler(args.lr_scheduler, optimizer, num_warmup_steps=warmup * world,
                              num_training_steps=max_steps * world)
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler)

    if not args.resume:  # after the model, teacher and data loaded (one may be the previous run's final/), before
        # the first write: a run that fails on its inputs leaves the previous results where they were
        if accelerator.is_main_process:
            moved = run_outputs.set_aside_previous_run(output)
            if moved:
                accelerator.print(f"starting over: the previous run's {' and '.join(moved)} moved to "
                                  f"{output / run_outputs.PREVIOUS}")
        accelerator.wait_for_everyone()
    state = _State(settings=settings)
    checkpoint = output / checkpointing.CHECKPOINT
    if resume_from is not None:
        accelerator.load_state(str(resume_from))
        state = _State(**checkpointing.read_state(resume_from))
        accelerator.print(f"resumed from {resume_from} at step {state.step} ({state.tokens:,} tokens)")

    report = {"attn_implementation": attn, "max_steps": max_steps, "tokens_per_step": tokens_per_step,
              "num_processes": world, "distributed_type": str(accelerator.distributed_type.value),
              "mixed_precision": accelerator.mixed_precision, "device": str(accelerator.device),
              "objective": distillation.objective_name(args), "teacher": args.teacher, "control": args.control}
    run_info = {"model": args.model, "kv_heads": None if args.control else args.kv_heads,
                "convert_method": args.convert_method if args.kv_heads and not args.control else None,
                "eval_tokens": len(eval_rows) * (len(eval_rows[0]["input_ids"]) - 1)} | {
        name: report[name] for name in ("objective", "teacher", "control", "tokens_per_step", "max_steps")}

    def measure(step: int) -> None:
        state.evals.append({"step": step, "tokens": state.tokens,
                            "perplexity": evaluate_perplexity(model, eval_loader, accelerator)})
        accelerator.print(f"step {step} ({state.tokens:,} tokens): eval perplexity {state.evals[-1]['perplexity']:.3f}")
        if accelerator.is_main_process:
            _write_eval_log(output, run_info, state)

    if state.step == 0 and objective is not None and state.teacher_perplexity is None:
        with accelerator.autocast():  # as the student's prepared forward runs
            state.teacher_perplexity = evaluate_perplexity(objective.teacher, eval_loader, accelerator)
        accelerator.print(f"teacher: eval perplexity {state.teacher_perplexity:.3f}")
    if state.step == 0 and (args.eval_every or args.eval_at_tokens):
        measure(0)

    from tqdm.auto import tqdm

    progress = tqdm(total=max_steps, initial=state.step, disable=not accelerator.is_local_main_process,
                    desc="train", unit="step")
    device = accelerator.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    interrupted, stopped_early, run_start = False, False, time.perf_counter()
    with _StopFlag() as stop:
        while state.step < max_steps and not interrupted:
            epoch, offset = divmod(state.step, steps_per_epoch)
            # Batches already consumed this epoch (per process) are skipped: the data position resumes.
            loader = accelerator.skip_first_batches(train_loader, offset * args.grad_accum) if offset else train_loader
            # A prepared loader re-seeds its sampler with its own epoch counter when iterated (a fresh
            # skipping loader would say 0): set both it and our sampler to the epoch we are in.
            loader.set_epoch(epoch)
            order.set_epoch(epoch)
            micro, step_loss, step_parts, step_tokens = 0, 0.0, {}, 0
            for batch in loader:
                with accelerator.accumulate(model):
                    if objective is None:
                        loss, parts = model(**batch).loss, {}
                    else:
                        loss, parts = objective(model, batch)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and args.max_grad_norm:
                        accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                micro += 1
                step_loss += loss.detach().float() / args.grad_accum
                for name, value in parts.items():
                    step_parts[name] = step_parts.get(name, 0.0) + value.float() / args.grad_accum
                step_tokens += batch["input_ids"].numel()
                if micro % args.grad_accum:
                    continue
                tokens = accelerator.reduce(torch.tensor(step_tokens, device=device), reduction="sum").item()
                mean_loss = accelerator.reduce(step_loss, reduction="mean").item()
                for name, value in step_parts.items():
                    state.loss_parts.setdefault(name, []).append(
                        round(accelerator.reduce(value, reduction="mean").item(), 6))
                tokens_before = state.tokens
                state.step += 1
                state.tokens += tokens
                state.losses.append(round(mean_loss, 6))
                step_loss, step_parts, step_tokens = 0.0, {}, 0
                progress.update(1)
                progress.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
                end_here = bool(on_step_end(state.step, mean_loss)) if on_step_end is not None else False
                # Every process must agree on stopping (a signal, or on_step_end on one of them).
                flags = accelerator.reduce(torch.tensor([float(stop.requested), float(end_here)], device=device),
                                           reduction="sum")
                interrupted = flags[0].item() > 0
                if flags[1].item() > 0 and state.step < max_steps:
                    max_steps, stopped_early = state.step, True
                if _eval_due(args, state.step, max_steps, tokens_before, state.tokens):
                    measure(state.step)
                periodic = args.save_every and (state.step % args.save_every == 0 or state.step == max_steps)
                if interrupted or periodic:
                    state.elapsed_s += time.perf_counter() - run_start
                    run_start = time.perf_counter()
                    with run_outputs.writing(checkpoint):
                        checkpointing.save(accelerator, output, asdict(state))
                if interrupted or state.step >= max_steps:
                    break
                if micro == (steps_per_epoch - offset) * args.grad_accum:
                    break  # leftover batches that cannot fill a whole step are dropped, every epoch alike
    progress.close()
    state.elapsed_s += time.perf_counter() - run_start
    run_seconds = max(state.elapsed_s, 1e-9)
    report |= {
        "interrupted": interrupted,
        "stopped_early": stopped_early,
        "steps": state.step,
        "tokens": state.tokens,
        "train_seconds": round(state.elapsed_s, 2),
        "tokens_per_s": round(state.tokens / run_seconds, 1),
        "peak_memory_bytes": _peak_memory_bytes(device),
        "first_loss": state.losses[0] if state.losses else None,
        "last_loss": state.losses[-1] if state.losses else None,
        "losses": state.losses,
        "loss_parts": state.loss_parts,
        "teacher_perplexity": state.teacher_perplexity,
        "evals": state.evals,
    }
    if interrupted:
        accelerator.print(f"interrupted at step {state.step}: checkpoint in {checkpoint}; rerun to resume")
        return report
    accelerator.wait_for_everyone()
    run_outputs.save_final(accelerator, model, tokenizer, output, report)
    return report
