"""``hf-flashpatch`` command line: ``demo``, ``convert``, ``doctor``."""

from __future__ import annotations

import argparse
import sys

USAGE = """usage: hf-flashpatch {demo,convert,doctor} [args]

  demo     load the shipped SmolLM2-135M (or --model PATH), patch it, check logits vs sdpa, generate
  convert  SRC DST --kv-heads N [--method pca|mean|first|random] [--overwrite]: MHA -> GQA/MQA checkpoint
  doctor   GPU, arch, nvcc, pycuda, cache dir and the shipped kernel builds (--compile builds them all)
"""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr (``PROG: error: argument --x: ...``) and exit
    status 2, without the usage block that would bury it (``--help`` still prints the usage)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (``0`` or ``-3`` name themselves in the error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def fail(prog: str, message: str) -> int:
    """Print one error line for ``prog`` on stderr; returns exit status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from .demo import main as run
    elif command == "convert":
        from .checkpoint_conversion import main as run
    elif command == "doctor":
        from .doctor import main as run
    else:
        print(f"unknown command {command!r}\n{USAGE}", file=sys.stderr)
        return 2
    return int(run(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
