"""How much the masked walks' deals depend on the modelled work overhead (CPU only): for each issue-14 causal shape,
the walk the decision room picks with WORK_TILE_OVERHEAD 1.0 (shipped) and with the overhead o_true, both evaluated
under o_true (each work = its key tiles + o_true), as makespan / ideal. Run: python deal_sensitivity.py."""
import dataclasses
from hf_flashpatch.kernels import heuristics as h, work_list as wl
def loads_of(walk, weights_true, count, pairs, ctas):
    if walk.listed is not None:
        t = walk.listed.table; off = t[:ctas+1]; works = t[ctas+1:]
        return max(sum(weights_true[w % count] for w in works[off[b]:off[b+1]]) for b in range(ctas))
    if walk.ctas == ctas:  # snake of section
        return wl.snake_makespan(list(weights_true), pairs, walk.section, ctas)
    return None
for d, bm, heads in ((128, 128, 16), (64, 192, 32)):
  for S in (2048, 4096, 8192, 16384):
    B = 16384 // S; pairs = B * heads
    kt = h.query_tile_key_tiles(S, S, 1, bm, 128, -1, 0)
    count = len(kt)
    for o_true in (1.0, 1.5, 2.0, 2.3):
        wt = tuple(n + o_true for n in reversed(kt))
        ideal = sum(wt) * pairs / 132
        res = []
        for o_model in (1.0, o_true):
            h.WORK_TILE_OVERHEAD = o_model
            h.hopper_forward_schedule.cache_clear()
            walk = h.hopper_forward_schedule(S, S, 1, bm, 128, -1, 0, pairs, 132, False, S * d * 4)
            m = loads_of(walk, wt, count, pairs, 132)
            res.append((o_model, walk.ctas, walk.section, walk.listed is not None, None if m is None else round(m / ideal, 4)))
        print(f"d{d} {B}x{S} o_true {o_true}: " + " | ".join(str(r) for r in res))
