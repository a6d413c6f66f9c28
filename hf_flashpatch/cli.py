"""``hf-flashpatch`` command line: ``demo``, ``convert``, ``doctor``."""

from __future__ import annotations

import sys

USAGE = """usage: hf-flashpatch {demo,convert,doctor} [args]

  demo     load the shipped SmolLM2-135M (or --model PATH), patch it, check logits vs sdpa, generate
  convert  SRC DST --kv-heads N [--method mean|first|random]: MHA -> GQA/MQA checkpoint
  doctor   GPU, arch, nvcc, pycuda, cache dir and kernel variants (--compile builds them all)
"""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from .demo import main as run
    elif command == "convert":
        from .convert import main as run
    elif command == "doctor":
        from .doctor import main as run
    else:
        print(f"unknown command {command!r}\n{USAGE}", file=sys.stderr)
        return 2
    return int(run(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
