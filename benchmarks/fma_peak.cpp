// This CPU's fp32 FMA peak: 12 independent 8-wide FMA chains a thread, 1 and 2 threads.
//
//     g++ -O3 -march=native -pthread benchmarks/fma_peak.cpp -o /tmp/fma_peak && /tmp/fma_peak
//
// The floor of a batched decoding step on the GGUF kernels is (weights x rows) / this rate
// (docs/engine.md). x86 with AVX2 + FMA only.
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

static float run(long iters) {
  __m256 a[12];
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i));
  for (long k = 0; k < iters; ++k)
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
  float s = 0.0f;
  for (int i = 0; i < 12; ++i) {
    float t[8];
    _mm256_storeu_ps(t, a[i]);
    s += t[0];
  }
  return s;  // used, so the loop is not optimised away
}

int main() {
  const long iters = 200000000;
  for (int n_threads : {1, 2}) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    std::vector<float> out(n_threads);
    for (int i = 0; i < n_threads; ++i) threads.emplace_back([&, i] { out[i] = run(iters); });
    for (auto& thread : threads) thread.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%d thread(s): %.1f G multiply-adds/s fp32 (checksum %.3f)\n", n_threads,
                double(iters) * 12 * 8 * n_threads / s / 1e9, out[0]);
  }
}
