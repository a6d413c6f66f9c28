"""The SASS readers of the compile-check tests, on excerpts of real sm_90a SASS (the d128 backward's dQ product
before and after its descriptors moved to uniform registers; the multicast forward's remote mbarrier arrival with a
cluster-scope release and with the default one)."""

from ptxas_report import (descriptor_moves_inside_wgmma_groups, gpu_fences_before_remote_arrivals,
                          hgmmas_waiting_on_moves)

# dQ = dS K, K's descriptor derived from `tid / 128`: two R2UR before every HGMMA after the first
CHAINED = """
        /*68c0*/                   WARPGROUP.ARRIVE ;
        /*68d0*/                   R2UR UR10, R6 ;
        /*68e0*/                   R2UR UR11, R7 ;
        /*6900*/                   HGMMA.64x64x16.F32.BF16 R152, gdesc[UR8].tnspA.tnspB, RZ, !UPT ;
        /*6910*/                   R2UR UR10, R6 ;
        /*6920*/                   UIADD3 UR8, UR12, 0x4002880, URZ ;
        /*6930*/                   R2UR UR11, R7 ;
        /*6970*/                   HGMMA.64x64x16.F32.BF16 R152, gdesc[UR8].tnspA.tnspB, R152 ;
        /*6980*/                   R2UR UR10, R6 ;
        /*69a0*/                   R2UR UR11, R7 ;
        /*69e0*/                   HGMMA.64x64x16.F32.BF16 R152, gdesc[UR8].tnspA.tnspB, R152, gsb0 ;
        /*69f0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
"""
# the same product from uniform values: adds in uniform registers only; an R2UR for something else (a division)
UNIFORM = """
        /*6860*/                   R2UR UR13, R4 ;
        /*68b0*/                   UIADD3 UR10, UR38, 0x8000000, URZ ;
        /*68c0*/                   HGMMA.64x64x16.F32.BF16 R152, gdesc[UR8].tnspA.tnspB, RZ, !UPT ;
        /*68d0*/                   UIADD3 UR8, UR12, 0x4002880, URZ ;
        /*68e0*/                   UIADD3 UR10, UR38, 0x8000080, URZ ;
        /*68f0*/                   R2UR UR19, R0 ;
        /*6900*/                   UMOV UR9, 0x40000040 ;
        /*6910*/                   HGMMA.64x64x16.F32.BF16 R152, gdesc[UR8].tnspA.tnspB, R152, gsb0 ;
"""
# 192/128's score product: one descriptor pair of Q (k-step 1) kept in vector registers, the others uniform
ONE_PAIR = """
        /*7ac0*/                   WARPGROUP.ARRIVE ;
        /*7b00*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR40], RZ, !UPT ;
        /*7b10*/                   R2UR UR40, R160 ;
        /*7b20*/                   ULOP3.LUT UR42, UR9, 0x2, URZ, 0xfc, !UPT ;
        /*7b30*/                   R2UR UR41, R161 ;
        /*7b40*/                   UMOV UR43, 0x40000040 ;
        /*7bf0*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR40], R88 ;
        /*7c00*/                   ULOP3.LUT UR42, UR9, 0x4, URZ, 0xfc, !UPT ;
        /*7c10*/                   UMOV UR40, UR56 ;
        /*7c20*/                   UMOV UR41, UR57 ;
        /*7c30*/                   UMOV UR43, 0x40000040 ;
        /*7c40*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR40], R88, gsb0 ;
"""
# an R2UR into a descriptor register that a uniform write replaces before the HGMMA reads it
OVERWRITTEN = """
        /*3be0*/                   HGMMA.64x64x16.F32.BF16 R152, gdesc[UR8], RZ, !UPT ;
        /*3bf0*/                   R2UR UR10, R6 ;
        /*3c00*/                   UIADD3 UR10, UR13, 0x10002, URZ ;
        /*3c70*/                   HGMMA.64x64x16.F32.BF16 R152, gdesc[UR8], R152, gsb0 ;
"""


def test_descriptor_moves_inside_wgmma_groups():
    moves = descriptor_moves_inside_wgmma_groups(CHAINED)
    assert len(moves) == 4 and all("R2UR" in m for m in moves)  # the two before each of the group's later HGMMAs
    assert moves[0].startswith("/*6910*/")  # not the moves before the group's first HGMMA
    assert descriptor_moves_inside_wgmma_groups(UNIFORM) == []
    assert descriptor_moves_inside_wgmma_groups(OVERWRITTEN) == []


def test_hgmmas_waiting_on_moves_counts_each_group():
    assert hgmmas_waiting_on_moves(CHAINED) == {"/*6900*/": 2}  # both later HGMMAs of the chain wait
    assert hgmmas_waiting_on_moves(ONE_PAIR) == {"/*7b00*/": 1}  # the second waits, the third reads uniform copies
    assert len(descriptor_moves_inside_wgmma_groups(ONE_PAIR)) == 2
    assert hgmmas_waiting_on_moves(UNIFORM) == {} and hgmmas_waiting_on_moves(OVERWRITTEN) == {}


# a math warp handing a K/V slot back to the other CTA of its cluster, `mbarrier.arrive.release.cluster` (cuobjdump
# prints an encoding line under each instruction)
REMOTE_ARRIVAL_CLUSTER_RELEASE = """
        /*3d10*/              @!P6 MEMBAR.ALL.GPU ;                                                      /* 0x000000000000e992 */
                                                                                                         /* 0x020fec000000a000 */
        /*3d20*/              @!P6 ERRBAR;                                                               /* 0x000000000000e9ab */
                                                                                                         /* 0x000fc00000000000 */
        /*3d30*/              @!P6 CGAERRBAR ;                                                           /* 0x000000000000e5ab */
                                                                                                         /* 0x000fec0000000000 */
        /*3d40*/              @!P6 SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [UR14], RZ ;                        /* 0x000000ffffffe9a7 */
"""
# the same with the default (CTA-scope) release, as shipped: the local arrival, then the remote one
REMOTE_ARRIVAL_DEFAULT = """
        /*3ca0*/                   NOP ;                                                                 /* 0x0000000000007918 */
                                                                                                         /* 0x000fe20000000000 */
        /*3cb0*/              @!P6 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR55+0x34020], RZ ;                    /* 0x034020ffffffe9a7 */
                                                                                                         /* 0x000fe20008100037 */
        /*3cc0*/              @!P6 SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [UR14], RZ ;                        /* 0x000000ffffffe9a7 */
"""


def test_gpu_fences_before_remote_arrivals_are_found():
    found = gpu_fences_before_remote_arrivals(REMOTE_ARRIVAL_CLUSTER_RELEASE)
    assert len(found) == 1 and "MEMBAR.ALL.GPU" in found[0]
    assert gpu_fences_before_remote_arrivals(REMOTE_ARRIVAL_DEFAULT) == []
    # a fence far before the arrival (outside the window) is not its release
    far = REMOTE_ARRIVAL_CLUSTER_RELEASE.replace("@!P6 ERRBAR;", "@!P6 ERRBAR;\n" + "        /*3d21*/ NOP ;\n" * 6)
    assert gpu_fences_before_remote_arrivals(far) == []
