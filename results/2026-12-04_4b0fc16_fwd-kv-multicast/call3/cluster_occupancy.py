"""How many 2-CTA clusters of the multicast forward build fit at once (cuOccupancyMaxActiveClusters), by ctypes."""
import ctypes, dataclasses
import torch
from hf_flashpatch.kernels.build import compile_cubin, shared_bytes_of
from hf_flashpatch.kernels.forward import ForwardConfig
from hf_flashpatch.kernels.heuristics import HOPPER_SHAPES

torch.zeros(1, device="cuda")  # the primary context, current
cu = ctypes.CDLL("libcuda.so.1")
shape = HOPPER_SHAPES[(128, False)]
cfg = ForwardConfig.for_problem(128, "bf16", False, dataclasses.replace(shape, kv_cluster=2), arch="sm_90a")
cubin, _ = compile_cubin(cfg.build("sm_90a"))
smem = shared_bytes_of(cubin, cfg.entry) + 1024
mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
assert cu.cuModuleLoadData(ctypes.byref(mod), cubin) == 0
assert cu.cuModuleGetFunction(ctypes.byref(fn), mod, cfg.entry.encode()) == 0
print("set smem", cu.cuFuncSetAttribute(fn, 8, smem))  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint),
                ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


n = ctypes.c_int(-1)
rc = cu.cuOccupancyMaxActiveClusters(ctypes.byref(n), fn, ctypes.byref(LaunchConfig(132, 1, 1, cfg.threads, 1, 1, smem, None, None, 0)))
print(f"cuOccupancyMaxActiveClusters rc={rc} clusters={n.value} (SMs {torch.cuda.get_device_properties(0).multi_processor_count}, smem {smem})")
