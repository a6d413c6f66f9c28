"""The online softmax with and without the rise bound, emulated in torch on the CPU (fp32 state, P rounded to bf16 for
P V, 160-key tiles), against an fp64 softmax: the accuracy cost of exponentiating against a held reference. Run:
python accuracy_sim.py (seconds)."""
import torch, math
torch.manual_seed(0)
def online(scores, v, scale_log2, rise_log2=None, bn=160):
    # scores (R, N) raw fp32, v (N, D). P rounded to bf16 before P V, as the kernel does.
    R, N = scores.shape
    m = torch.full((R,), -math.inf); l = torch.zeros(R); o = torch.zeros(R, v.shape[1]); rescales = 0
    for j in range(0, N, bn):
        s = scores[:, j:j+bn]
        tmax = torch.maximum(m, s.max(1).values)
        if rise_log2 is None:
            moves = tmax != m
        else:
            bound = torch.where(m == -math.inf, torch.full_like(m, -math.inf), m + rise_log2 / scale_log2)
            moves = tmax > bound
        ref = torch.where(moves, tmax, m)
        ms = torch.where(ref == -math.inf, torch.zeros_like(ref), ref * scale_log2)
        corr = torch.where(moves, torch.exp2(m * scale_log2 - ms), torch.ones_like(m))
        p = torch.exp2(s * scale_log2 - ms[:, None])
        l = l * corr + p.sum(1)
        if moves.any():
            rescales += 1
            o = o * corr[:, None]
        o = o + p.bfloat16().float() @ v[j:j+bn]
        m = ref
    return o / l[:, None], (m * scale_log2 + torch.log2(l)) * math.log(2), rescales
for name, gen in [("randn", lambda: torch.randn(64, 2048) * math.sqrt(128)),
                  ("rising", lambda: torch.randn(64, 2048) * 4 + torch.linspace(0, 400, 2048)),
                  ("spiky", lambda: torch.randn(64, 2048) * 30),
                  ("huge", lambda: torch.randn(64, 2048) * 3000)]:
    s = gen(); v = torch.randn(2048, 128).bfloat16().float(); scale = 1 / math.sqrt(128); sl2 = scale * 1.4426950408889634
    ref_o = torch.softmax(s.double() * scale, 1) @ v.double(); ref_lse = torch.logsumexp(s.double() * scale, 1)
    for rise in (None, 8.0):
        o, lse, n = online(s, v, sl2, rise)
        print(f"{name:7s} rise={rise}: out err {(o.double() - ref_o).abs().max():.2e}  lse err {(lse.double() - ref_lse).abs().max():.2e}  rescaled tiles {n}/13")
print("--- outputs rounded to bf16, against torch's bf16 sdpa on CPU")
import torch.nn.functional as F
for name, gen in [("randn", lambda: torch.randn(64, 2048) * math.sqrt(128)),
                  ("spiky", lambda: torch.randn(64, 2048) * 30),
                  ("spikier", lambda: torch.randn(64, 2048) * 60)]:
    worst = {}
    for trial in range(5):
        s = gen(); v = torch.randn(2048, 128).bfloat16().float(); scale = 1 / math.sqrt(128); sl2 = scale * 1.4426950408889634
        ref_o = torch.softmax(s.double() * scale, 1) @ v.double()
        # q k such that q k^T = s is not needed: torch's bf16 attention from scores: softmax in fp32 of bf16 scores
        t = (torch.softmax(s * scale, 1).bfloat16().float() @ v)
        t = t / 1.0
        errs = {"torch-like": (t.bfloat16().double() - ref_o).abs().max().item()}
        for rise in (None, 8.0):
            o, lse, n = online(s, v, sl2, rise)
            errs[f"rise={rise}"] = (o.bfloat16().double() - ref_o).abs().max().item()
        for k_, e in errs.items(): worst[k_] = max(worst.get(k_, 0), e)
    print(name, {k_: f"{e:.2e}" for k_, e in worst.items()})
