// hf_flashpatch: a walk's work tiles handed from one producer thread to the math warps through shared memory.
//
// Decoding a work tile (the walk's list entry, then integer divisions into head, sequence and query block, the
// sequence's span and its visible key tiles) is a chain of dependent loads and divisions of 1,000 clocks and more. A
// thread that walks a work ahead of the math warps anyway (the forward's Q thread, which loads each work's Q rows)
// decodes each tile once and publishes it in one of two slots; a math warp takes it with a wait on the slot's
// mbarrier (complete long before) and a few shared-memory loads, under its work's last P V.
//
// Slot n % 2 holds the walk's work n, and after the walk's last work the empty tile (QueryTile::empty) that ends it.
// The publisher may rewrite slot n % 2 with work n + 2 only once every math warp read work n from it: the forward's
// Q thread publishes work n + 2 after it waited for work n + 1's "Q empty" (every math warp's last S of that work
// retired), and a math warp takes work n + 1 ... n + 2 under the last P V of works n ... n + 1, so before it arrives.
// Those waits read a phase by its parity, so no warpgroup may complete two "Q empty" phases ahead of them. With Q
// boxes none can (its next phase needs Q rows the Q thread loads after the wait). Without (a launch with no Q map),
// only timing holds it: between a publish and the Q thread's next wait lie a few instructions, while a warpgroup's
// second phase needs its last P V, its epilogue and the next work's S.
#pragma once
#include "fwd_geometry.cuh"
#include "hopper.cuh"

namespace hfp {
namespace fwd {

// The shared memory the handoff takes at `base` (16-byte aligned): two "published" mbarriers, then two tiles.
constexpr int kTileHandoffBytes = 16 + 2 * ((static_cast<int>(sizeof(QueryTile)) + 15) / 16 * 16);

struct TileHandoff {
  uint32_t ready_bars;  // (2,) shared-space mbarriers: slot s holds a published tile (one arrival: the publisher's)
  QueryTile* slots;     // (2,) the tiles, generic addresses of shared memory

  // base: the handoff's shared-space address; smem_raw / raw: the kernel's shared memory and its shared-space address.
  __device__ __forceinline__ static TileHandoff at(uint32_t base, unsigned char* smem_raw, uint32_t raw) {
    return {base, reinterpret_cast<QueryTile*>(smem_raw + (base + 16 - raw))};
  }
  __device__ __forceinline__ void init() const {  // one thread, before the kernel's barrier that follows inits
    hfp::sm90::mbarrier_init(ready_bars, 1);
    hfp::sm90::mbarrier_init(ready_bars + 8, 1);
  }
  // Work n's tile (empty: the walk ended). The arrival releases the stores to the waiters.
  __device__ __forceinline__ void publish(int n, const QueryTile& tile) const {
    slots[n & 1] = tile;
    hfp::sm90::mbarrier_arrive(ready_bars + 8 * (n & 1));
  }
  __device__ __forceinline__ QueryTile take(int n) const {
    hfp::sm90::mbarrier_wait(ready_bars + 8 * (n & 1), (n >> 1) & 1);
    return slots[n & 1];
  }
};

}  // namespace fwd
}  // namespace hfp
