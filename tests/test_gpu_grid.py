"""``scripts/gpu_grid.sh`` (the GPU tests in parallel groups on the device) runs every GPU test file: a new file
left out of its groups would never run before a GPU change is called verified."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_gpu_test_file_is_in_a_grid_group():
    script = (ROOT / "scripts" / "gpu_grid.sh").read_text()
    listed = set(re.findall(r"tests/gpu/(test_\w+\.py)", script))
    files = {p.name for p in (ROOT / "tests" / "gpu").glob("test_*.py")}
    assert files and files <= listed, sorted(files - listed)
