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
