"""Compile forward builds of modified configs; print ptxas and a SASS mix. args: d:mask:field=val,field=val"""
import collections, dataclasses, os, re, subprocess, sys, tempfile
os.environ.setdefault("HF_FLASHPATCH_CACHE", tempfile.mkdtemp())
from hf_flashpatch.kernels import build as b, forward
CUOBJ = "/work/tools/triton/backends/nvidia/bin/cuobjdump"
for spec in sys.argv[1:]:
    d, m, *mods = spec.split(":")
    cfg = forward.ForwardConfig.for_problem(int(d), "bf16", m == "1", arch="sm_90a")
    kw = {}
    for mod in (mods[0].split(",") if mods and mods[0] else []):
        k, v = mod.split("="); kw[k] = int(v) if v.isdigit() else v == "True"
    cfg = dataclasses.replace(cfg, **kw)
    cubin, rep = b.compile_cubin(cfg.build(), verbose_ptxas=True)
    path = tempfile.mktemp(suffix=".cubin"); open(path, "wb").write(cubin)
    sass = subprocess.run([CUOBJ, "-sass", path], capture_output=True, text=True).stdout
    open(f"/tmp/s37/{spec.replace(':','_').replace(',','_').replace('=','')}.sass", "w").write(sass)
    ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass))
    lines = [l.strip() for l in rep.splitlines() if "registers" in l or "spill" in l]
    print(spec, lines[-2:] if lines else rep[-300:])
    print("  total", sum(ops.values()), {k: ops[k] for k in ("ISETP", "FSEL", "R2UR", "LDL", "STL", "HGMMA", "MUFU", "BRA")})
