"""Reading ``nvcc -Xptxas -v`` reports in the compile-check tests."""

import re


def spills_by_entry(report: str) -> dict[str, tuple[int, int]]:
    """{kernel entry: (spill store bytes, spill load bytes)} from an ``-Xptxas -v`` report."""
    spills, entry = {}, None
    for line in report.splitlines():
        found = re.search(r"Compiling entry function '(\w+)'", line)
        if found:
            entry = found.group(1)
        found = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if found and entry is not None:
            spills[entry] = (int(found.group(1)), int(found.group(2)))
    return spills


def _moves_feeding_hgmmas(sass: str) -> list[tuple[str, list[str]]]:
    """(address of the group's first HGMMA, the ``R2UR`` moves this HGMMA's descriptor waits on) for each HGMMA after
    the first of a wgmma group (after an HGMMA without ``gsb0``; ``gdesc[URn]`` reads URn..URn+3)."""
    fed, group, pending, open_group = [], "", [], False
    for line in sass.splitlines():
        instruction = line.split(";")[0]
        if "HGMMA" in instruction:
            found = re.search(r"gdesc\[UR(\d+)\]", instruction)
            if not open_group:
                group = instruction.strip()[:8]
            elif found:
                first = int(found.group(1))
                fed.append((group, [move for register, move in pending if first <= register < first + 4]))
            open_group, pending = "gsb0" not in instruction, []
        elif "WARPGROUP." in instruction:
            open_group, pending = False, []
        elif open_group:
            found = re.search(r"R2UR\s+UR(\d+),", instruction)
            if found:
                pending.append((int(found.group(1)), instruction.strip()))
            else:  # a later write of the register hides the move
                written = re.search(r"^\s*(?:/\*\w+\*/)?\s*(?:@!?U?P\w+\s+)?U\w+(?:\.\w+)*\s+UR(\d+)", instruction)
                if written:
                    pending = [(r, m) for r, m in pending if r != int(written.group(1))]
    return fed


def descriptor_moves_inside_wgmma_groups(sass: str) -> list[str]:
    """The ``R2UR`` instructions that move an operand descriptor into a uniform register between two HGMMAs of one
    wgmma group (after an HGMMA without ``gsb0``, feeding the next HGMMA's ``gdesc[URn]``, which reads URn..URn+3).
    Each makes that HGMMA wait for a vector-to-uniform move: a descriptor derived from a per-thread value (the
    warpgroup as ``tid / 128`` rather than ``uniform_warpgroup``) puts two of them before every HGMMA of the chain."""
    return [move for _, moves in _moves_feeding_hgmmas(sass) for move in moves]


def hgmmas_waiting_on_moves(sass: str) -> dict[str, int]:
    """{address of a wgmma group's first HGMMA: how many of its later HGMMAs wait on a descriptor move}, for the groups
    where any does. A descriptor derived from a per-thread value makes every later HGMMA of its groups wait; one
    HGMMA waiting is one descriptor pair that ptxas kept in vector registers."""
    waiting = {}
    for group, moves in _moves_feeding_hgmmas(sass):
        if moves:
            waiting[group] = waiting.get(group, 0) + 1
    return waiting


def _instructions(sass: str) -> list[str]:
    """A cuobjdump listing's instructions, each as ``/*address*/ OPCODE operands`` (the encoding lines between them,
    and the trailing ``;`` and comments, left out)."""
    lines = (line.split(";")[0].strip() for line in sass.splitlines())
    return [line for line in lines if re.match(r"/\*[0-9a-f]+\*/", line)]


def gpu_fences_before_remote_arrivals(sass: str, window: int = 6) -> list[str]:
    """The GPU-scope memory fences (``MEMBAR.ALL.GPU`` / ``.SYS``) among the ``window`` instructions before an arrival
    on another CTA's mbarrier (``SYNCS.ARRIVE.TRANS64.RED``, from ``mbarrier.arrive`` on a ``shared::cluster``
    address). A cluster-scope release on that arrival makes ptxas emit one before each (with ``ERRBAR`` /
    ``CGAERRBAR``): it waits for every memory access the thread has in flight, once per K/V slot and warp."""
    fences, recent = [], []
    for instruction in _instructions(sass):
        if "SYNCS.ARRIVE.TRANS64.RED" in instruction:
            fences += [f for f in recent if re.search(r"MEMBAR\.\w+\.(GPU|SYS)", f)]
        recent = (recent + [instruction])[-window:]
    return fences


def steady_softmax_stretches(sass: str) -> list[str]:
    """The stretches of a Hopper forward build's SASS between retiring a key-loop step's S while its P V still runs
    (``WARPGROUP.DEPBAR.LE gsb0, 0x1``) and waiting for that P V (``... gsb0, 0x0``): each key loop's steady softmax,
    which must run under the P V, one instruction a line."""
    stretches, current = [], None
    for instruction in _instructions(sass):
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in instruction:
            current = []
        elif "WARPGROUP.DEPBAR.LE gsb0, 0x0" in instruction and current is not None:
            stretches.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(instruction)
    return stretches
