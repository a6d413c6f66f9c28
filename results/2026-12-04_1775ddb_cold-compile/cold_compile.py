"""Cold nvcc compile time (empty cache) of the sm_90a builds issue 14's benchmark runs, one at a time."""
import os, tempfile, time, subprocess
os.environ["HF_FLASHPATCH_CACHE"] = tempfile.mkdtemp()
import torch
from hf_flashpatch.kernels import build as b, heuristics
builds = []
for d in (64, 128):
    for masked in (False, True):
        for one in (False, True):
            cfg = heuristics.forward_config(d, "bf16", masked, "sm_90a", one_cta_per_tile=one)
            builds.append((f"forward d{d} {'masked' if masked else 'unmasked'}{' one-cta-per-tile' if one else ''}", cfg.build()))
import dataclasses
unmasked = heuristics.forward_config(128, "bf16", False, "sm_90a")
builds.append(("forward d128 unmasked, kv_cluster=" + str(unmasked.kv_cluster), unmasked.build()))
builds.append(("forward d128 unmasked, plain", dataclasses.replace(unmasked, kv_cluster=1).build()))
for d in (64, 128):
    builds.append((f"backward d{d}", heuristics.backward_config(d, torch.bfloat16, False, "sm_90a").build()))
seen = set()
print(subprocess.run([b.find_nvcc(), "--version"], capture_output=True, text=True).stdout.splitlines()[-1])
for name, build in builds:
    if build is None or build in seen:
        continue
    seen.add(build)
    t = time.perf_counter(); b.compile_cubin(build); dt = time.perf_counter() - t
    print(f"{name:40s} {dt:5.2f} s")
