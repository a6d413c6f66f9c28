"""Makespan of static and dynamic work-tile schedules for the persistent Hopper forward, in tile units (a tile
weighs its visible key tiles + 1 for its prologue/epilogue), over 132 SMs: the model behind heuristics.hopper_forward_ctas."""
import heapq, math
def works(seqlen, block_m, block_n, pairs, causal):
    count = math.ceil(seqlen / block_m); W=[]
    for pair in range(pairs):
        for m_rev in range(count):
            m = count-1-m_rev
            hi = min(seqlen, (m+1)*block_m) if causal else seqlen
            W.append(math.ceil(hi/block_n) + 1.0)  # +1: prologue/epilogue cost in tile units
    return W
def static(W, grid, snake):
    load=[0.0]*grid
    for w,wt in enumerate(W):
        k, b = divmod(w, grid)
        if snake and k % 2: b = grid-1-b
        load[b]+=wt
    return max(load)
def dynamic(W, grid):  # hardware grid / atomic counter: next work to the first free CTA
    h=[(0.0,b) for b in range(grid)]
    for wt in W:
        t,b=heapq.heappop(h); heapq.heappush(h,(t+wt,b))
    return max(t for t,_ in h)
for (name, S, bm, pairs, causal) in [("d128 4k full",4096,128,64,0),("d128 4k causal",4096,128,64,1),("d64 4k causal",4096,192,64,1),
        ("d64 4k full",4096,192,64,0),("d128 2k causal",2048,128,128,1),("d128 16k causal",16384,128,16,1),("d64 16k causal",16384,192,32,1),("d64 8k causal",8192,192,32,1),("d128 1k causal",1024,128,256,1)]:
    W=works(S,bm,128,pairs,causal); ideal=sum(W)/132
    print(f"{name:18s} works {len(W):5d} ideal {ideal:7.1f}  strided {static(W,132,0)/ideal:5.3f} snake {static(W,132,1)/ideal:5.3f} dynamic {dynamic(W,132)/ideal:5.3f}")
print("--- sectioned m_rev-major orders")
def reorder(W, pairs, count, S):
    out=[]
    for s0 in range(0,pairs,S):
        sec=list(range(s0,min(pairs,s0+S)))
        for m_rev in range(count):
            for pair in sec: out.append(W[pair*count+m_rev])
    return out
for (name, Sq, bm, pairs, causal) in [("d128 4k causal",4096,128,64,1),("d64 4k causal",4096,192,64,1),("d128 2k causal",2048,128,128,1),("d128 16k causal",16384,128,16,1),("d64 16k causal",16384,192,32,1),("d64 8k causal",8192,192,32,1),("d128 1k causal",1024,128,256,1),("d128 8k causal",8192,128,32,1)]:
    W=works(Sq,bm,128,pairs,causal); ideal=sum(W)/132; count=math.ceil(Sq/bm)
    row=[]
    for S in (1,2,4,8,16,pairs):
        R=reorder(W,pairs,count,S)
        row.append(f"S{S}:{static(R,132,0)/ideal:.3f}/{static(R,132,1)/ideal:.3f}")
    print(f"{name:16s}", " ".join(row))
