"""The SASS readers of the compile-check tests, on excerpts of real sm_90a SASS (the d128 backward's dQ product
before and after its descriptors moved to uniform registers)."""

from ptxas_report import descriptor_moves_inside_wgmma_groups

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
