"""The held reference with and without the sums' rounding, emulated in torch on the CPU (fp32 state, P rounded to
bf16 for P V), against an fp64 softmax, on the failing GPU test's shapes (192/128, 113 and 239 keys, 64-key tiles;
8 query heads on one K/V head) and a d64 one. The limit is the GPU test's: twice the error of torch's sdpa (here fp32
on the CPU, rounded to bf16) plus 1e-3. Run: python accuracy_sim_rounding.py (a few minutes)."""
import math

import torch
import torch.nn.functional as F


def online(s, v, sl2, rise, rounding, bn):
    """s (R, N) raw fp32 scores, v (N, D). rise: None = the reference moves to every new maximum (main)."""
    R, N = s.shape
    m = torch.full((R,), -math.inf); l = torch.zeros(R); o = torch.zeros(R, v.shape[1])
    for j in range(0, N, bn):
        t = s[:, j:j + bn]
        tmax = torch.maximum(m, t.max(1).values)
        moves = tmax != m if rise is None else tmax > torch.where(m == -math.inf, m, m + rise / sl2)
        ref = torch.where(moves, tmax, m)
        ms = torch.where(ref == -math.inf, torch.zeros_like(ref), ref * sl2)
        corr = torch.where(moves, torch.exp2(m * sl2 - ms), torch.ones_like(m))
        p = torch.exp2(t * sl2 - ms[:, None])
        l = l * corr + p.sum(1)
        if rounding:  # the tile's largest probability as P V reads it
            top = torch.exp2(tmax * sl2 - ms)
            l = l + (top.bfloat16().float() - top)
        o = o * corr[:, None] + p.bfloat16().float() @ v[j:j + bn]
        m = ref
    return o / l[:, None]


VARIANTS = {"main": (None, False), "held": (8.0, False), "held+rounding": (8.0, True)}
for seeds in (range(0, 6), range(100, 116)):
    for d, dv, bn, n in [(192, 128, 64, 113), (192, 128, 64, 239), (64, 64, 128, 239)]:
        worst = {k: 0.0 for k in VARIANTS}; margin = {k: 0.0 for k in VARIANTS}
        for seed in seeds:
            torch.manual_seed(seed)
            q = torch.randn(8, n, d).bfloat16(); k = torch.randn(n, d).bfloat16(); v = torch.randn(n, dv).bfloat16()
            sc = d ** -0.5; sl2 = sc / math.log(2)
            ref = torch.softmax((q.double() @ k.double().T) * sc, -1) @ v.double()
            base = F.scaled_dot_product_attention(q[None].float(), k[None, None].expand(1, 8, n, d).float(),
                                                  v[None, None].expand(1, 8, n, dv).float())[0].bfloat16()
            limit = 2 * (base.double() - ref).abs().max().item() + 1e-3
            for name, (rise, rounding) in VARIANTS.items():
                out = torch.stack([online(q[h].float() @ k.float().T, v.float(), sl2, rise, rounding, bn)
                                   for h in range(8)]).bfloat16().double()
                err = (out - ref).abs().max().item()
                worst[name] = max(worst[name], err); margin[name] = max(margin[name], err / limit)
        print(f"seeds {seeds.start}-{seeds.stop - 1}, d {d}/{dv}, {n} keys, {bn}-key tiles: " + ", ".join(
            f"{name} worst {worst[name]:.4f} (worst err/limit {margin[name]:.2f})" for name in VARIANTS))
