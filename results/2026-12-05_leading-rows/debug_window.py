"""Where batched (leading rows) and varlen differ at seqlen 700, window (200, 37): per case, batched with the shipped
lead, batched with lead 0 and varlen; bit equality, the rows that differ, and each one's error against fp32."""
import torch

from hf_flashpatch.kernels import forward as fwd
from hf_flashpatch.kernels.forward import attention_forward
from hf_flashpatch.reference import attention_reference

real_lead = fwd.leading_rows


def run(q, k, v, window, lead_on=True, **varlen):
    fwd.leading_rows = real_lead if lead_on else (lambda rows, block_m: 0)
    for _ in range(3):  # NaN-filled blocks in the allocator, as the tests do
        torch.full((q.numel() // 2,), float("nan"), device="cuda")
    try:
        return attention_forward(q, k, v, causal=False, softmax_scale=None, softcap=None, window_left=window[0],
                                 window_right=window[1], **varlen)
    finally:
        fwd.leading_rows = real_lead


def case(dims, heads, window, seqlen):
    torch.manual_seed(11)
    (d, d_v), (h, h_kv) = dims, heads
    q = torch.randn(2, seqlen, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, seqlen, h_kv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, seqlen, h_kv, d_v, device="cuda", dtype=torch.bfloat16)
    lead, lead_lse = run(q, k, v, window)
    nolead, nolead_lse = run(q, k, v, window, lead_on=False)
    cu = torch.tensor([0, seqlen, 2 * seqlen], device="cuda", dtype=torch.int32)
    packed, packed_lse = run(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), window, cu_seqlens_q=cu,
                             cu_seqlens_k=cu, max_seqlen_q=seqlen, max_seqlen_k=seqlen)
    packed = packed.view(2, seqlen, h, d_v)
    packed_lse = packed_lse.view(h, 2, seqlen).transpose(0, 1)  # (H, B S) -> (B, H, S)
    want, want_lse = attention_reference(q.float(), k.float(), v.float(), window=window)
    tag = f"d{d}/{d_v} h{h}/{h_kv} win{window} s{seqlen}"
    for name, o, l in (("lead", lead, lead_lse), ("nolead", nolead, nolead_lse), ("varlen", packed, packed_lse)):
        err = (o.float() - want).abs()
        seen = ~torch.isneginf(want_lse)
        lerr = (l - want_lse)[seen].abs().max().item()
        bad = (err.amax(dim=-1) > 2e-2).nonzero()  # (b, s, h) rows off the oracle
        print(f"{tag} {name:7s} out err {err.max().item():.2e} lse err {lerr:.2e} rows off {len(bad)}"
              f"{' first ' + str(bad[:6].tolist()) if len(bad) else ''}")
    for a, b, la, lb, nm in ((lead, packed, lead_lse, packed_lse, "lead-vs-varlen"),
                             (nolead, packed, nolead_lse, packed_lse, "nolead-vs-varlen"),
                             (lead, nolead, lead_lse, nolead_lse, "lead-vs-nolead")):
        diff = (a != b).any(dim=-1)  # (B, S, H)
        ldiff = la != lb  # (B, H, S)
        rows = diff.nonzero()
        lrows = ldiff.nonzero()
        print(f"{tag} {nm:17s} out rows differ {len(rows)} {rows[:4].tolist()} max {(a.float()-b.float()).abs().max().item():.2e}"
              f" | lse differ {len(lrows)} {lrows[:4].tolist()}")


if __name__ == "__main__":
    print("lead at 700 rows:", real_lead(700, 128), real_lead(2100, 128), real_lead(2800, 128))
    for dims, heads in (((128, 128), (4, 4)), ((128, 128), (6, 2)), ((192, 128), (6, 2)), ((64, 64), (4, 4))):
        case(dims, heads, (200, 37), 700)
    case((128, 128), (4, 4), (-1, 0), 700)
    case((128, 128), (4, 4), (200, 37), 260)
