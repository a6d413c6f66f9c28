import re, sys
for f in sys.argv[1:]:
    print("==", f)
    runs = []
    for n, line in enumerate(open(f)):
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if not m: continue
        op = m.group(2)
        key = next((k for k in ("HGMMA", "R2UR", "UTMASTG", "WARPGROUP.DEPBAR", "MUFU.EX2", "BAR", "SYNCS.PHASECHK") if op.startswith(k)), None)
        if key is None: continue
        if runs and runs[-1][1] == key: runs[-1][2] += 1
        else: runs.append([n, key, 1])
    print(" ".join(f"{k}x{c}@{n}" for n, k, c in runs))
