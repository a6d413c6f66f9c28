// hf_flashpatch: the smallest kernel, used to check the build/launch layer (stream ordering, graph
// capture, threads, cache) independently of the attention kernels.
#include "primitives.cuh"

// y[i] = alpha * x[i] + y[i], fp32, one element per thread.
extern "C" __global__ void selftest_axpy(float* __restrict__ y, const float* __restrict__ x, float alpha, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
#ifdef SELFTEST_SPIN
  // Burn time so that a missing stream dependency would show up as a wrong result.
  float acc = 0.f;
  for (int s = 0; s < SELFTEST_SPIN; ++s) acc += __sinf(acc + s);
  if (acc == 12345.f) y[0] = acc;
#endif
  if (i < n) y[i] = alpha * x[i] + y[i];
}
