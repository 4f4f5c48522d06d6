// The GGUF kernels' arithmetic without torch: block formats, the packed layout, the GEMM
// (portable, AVX2 / AVX-512 and NEON paths), attention of a decoding step, norms and
// activations, over raw pointers. gguf_gemm.cpp binds them to torch tensors (and checks the
// tensors); check_kernels.cpp runs their exactness checks with no torch at all, so that the
// aarch64 build is compiled with a cross compiler and checked under qemu-aarch64 in CI
// (test/test_kernels_core.py).
//
// y = x W^T with W kept as a GGUF file's own blocks, x fp32: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
// (32 weights a block) and the K-quants Q4_K, Q5_K, Q6_K (256-weight super-blocks, read as the
// file holds them: no repacked copy; formats at QType below).
//
// Why by hand (docs/engine.md, PLATFORM.md): no maintained library multiplies fp32 activations
// by these blocks on a CPU without quantizing the activations. llama.cpp quantizes x to
// 8 bits (its answers drift from fp32's); torch's int4/int8 packed GEMMs vectorise only bf16
// activations on x86; onnxruntime's MatMulNBits takes a slow path for Q4_1's float minimum.
// Every path dequantizes each weight exactly as gguf's reference does (w = d * q + m in fp32:
// d * q is exact, one rounding for + m) and multiplies it by fp32 activations, so they compute
// the products of the dequantized fp32 weights the engine runs today; only the rounding of the
// summation differs, as between any two GEMM libraries.
// One exception, where the CPU has AVX-512 VNNI: decoding Q4_K / Q6_K multiplies the integer
// codes by x written as three 8-bit parts per 32 values (exact to ~2^-24 of the largest, as
// fp32 rounds it) with integer dot products, and scales each sub-block's sums once
// (groups_vnni_q4k): the same products, summed in another order. Where the CPU also has AMX
// (and Linux grants it), the prefill's Q4_K / Q6_K GEMM does the same on tiles: x as three
// 8-bit parts per 256 values, the integer weights as two bytes (groups_amx).
//
// Shapes: x (M, K) fp32 contiguous, M <= MAX_ROWS (a decoding step of M goals); W (N, K) held
// as ``pack_raw`` lays the blocks out at load (GROUP rows interleaved, see GROUP); y (M, N)
// fp32. Every weight is decoded once and used for all M rows. Groups of rows are split over
// the calling thread's threads (WorkerPool). K is a multiple of the type's block: 32 weights,
// 256 for the K-quants.
//
// Paths, chosen when the library is compiled (-march=native / -mcpu=native on the machine
// that runs it): AVX2 + FMA + F16C (AVX-512 widens the GEMM's groups to 16 rows) on x86; NEON
// (AdvSIMD, every AArch64 CPU: Jetson Xavier's Carmel, Orin's Cortex-A78AE) on ARM; and a
// portable scalar path everywhere, which the checks compare with the vector path on the same
// dequantized weights.
//
// One translation unit includes this header (the binding or the check program), so its
// functions stay in an anonymous namespace; the includer defines kernel_threads().

#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define TB_HAVE_AVX2 1
#else
#define TB_HAVE_AVX2 0
#endif

#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define TB_HAVE_NEON 1
#else
#define TB_HAVE_NEON 0
#endif

// Threads a kernel call may use on the calling thread (>= 1): defined by the includer.
int kernel_threads();

namespace {

// Threads of the kernels: each calling thread owns a pool of kernel_threads() threads (the
// binding: torch's intra-op count for that thread, what engine.threads sets), itself included.
//
// Why not torch's at::parallel_for (OpenMP): libgomp lets its workers spin a few ms between
// parallel regions, except when the process holds more OpenMP threads than CPUs - then they
// sleep at once and every region pays a futex wake-up. A ROS server holds a team per thread
// that ran torch ops (start-up, executors), so on a 2-core host each of the ~150 regions of a
// decoding step paid one: 26 ms a step in an executor thread against 11 ms on the main
// thread, same process (timebill_ros/bench/studies/node_step.py, docs/engine.md). These workers spin
// (yielding the core to any other runnable thread) for SPIN_US after a job, then sleep.
class WorkerPool {
 public:
  static constexpr int64_t SPIN_US = 2000;

  explicit WorkerPool(int n_threads) : n_threads_(n_threads) {
    for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { work_loop(); });
  }

  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& worker : workers_) worker.join();
  }

  int n_threads() const { return n_threads_; }

  // Run fn(begin, end) over [0, n) in chunks of at least ``grain``, on every thread of the
  // pool (the caller too); returns when all chunks are done. CHUNKS chunks a thread (8 was
  // tried: slower at one goal, the same at eight).
  static constexpr int64_t CHUNKS = 4;

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t parts = CHUNKS * n_threads_;
    const int64_t chunk = std::max<int64_t>(grain, (n + parts - 1) / parts);
    if (n_threads_ == 1 || n <= chunk) {
      if (n > 0) fn(0, n);
      return;
    }
    job_ = &fn;
    n_ = n;
    chunk_ = chunk;
    next_.store(0, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    if (sleepers_.load(std::memory_order_acquire) > 0) wake_.notify_all();
    do_chunks();
    const int64_t workers = static_cast<int64_t>(workers_.size());
    while (done_.load(std::memory_order_acquire) < workers) std::this_thread::yield();
  }

 private:
  void do_chunks() {
    for (;;) {
      const int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
      if (begin >= n_) return;
      (*job_)(begin, std::min(n_, begin + chunk_));
    }
  }

  void work_loop() {
    uint64_t seen = 0;
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      int64_t spins = 0;
      while (generation_.load(std::memory_order_acquire) == seen) {
        std::this_thread::yield();
        if (++spins % 64 == 0 && std::chrono::steady_clock::now() - start >
                                     std::chrono::microseconds(SPIN_US)) {
          std::unique_lock<std::mutex> lock(mutex_);
          sleepers_.fetch_add(1, std::memory_order_acq_rel);
          wake_.wait(lock, [&] {
            return generation_.load(std::memory_order_acquire) != seen;
          });
          sleepers_.fetch_sub(1, std::memory_order_acq_rel);
        }
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_) return;
      do_chunks();
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  const int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> next_{0}, done_{0}, sleepers_{0};
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
  bool stop_ = false;
};

// fn(begin, end) over [0, n) on the calling thread's pool (made or resized on first use).
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  thread_local std::unique_ptr<WorkerPool> pool;
  const int n_threads = std::max(1, kernel_threads());
  if (!pool || pool->n_threads() != n_threads) pool = std::make_unique<WorkerPool>(n_threads);
  pool->run(n, grain, fn);
}

// Temporaries of a step, kept per calling thread and reused (grown, never shrunk or cleared):
// a fresh std::vector a call meant a malloc and a zero-fill of up to ~200 kB a layer, and
// fresh pages (page faults) for the large ones - 1-2 ms of a batched step of 8 goals.
enum Scratch {
  NORMED, PROJ, QUERIES, ATTN, MLP, DELTA, OUTS, BESTS, TOTALS, SCORES, PART, PANEL, TAIL,
  SPANS, XPARTS, XUNITS, XSUMS, APARTS, AUNITS, ASUMS, APSUMS, ATILES, AOUT, N_SCRATCH
};

float* scratch(Scratch slot, int64_t n) {
  thread_local std::vector<float> buffers[N_SCRATCH];
  auto& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}


constexpr int64_t QK = 32;        // weights per block
constexpr int64_t QK_K = 256;     // weights per K-quant super-block
constexpr int64_t MAX_ROWS = 8;   // activation rows per call
constexpr int64_t MAX_BLOCK_BYTES = 210;  // Q6_K's super-block, the largest
// GGML type ids of the blocks read, all as the file holds them:
// - Q4_0 / Q4_1 / Q8_0: fp16 d (Q4_1: and fp16 m), then the codes; Q5_0 / Q5_1: fp16 d (Q5_1:
//   and fp16 m), the 32 fifth bits as a little-endian uint32 (read here as two 16-bit fields:
//   weights 0-15, then 16-31), 16 bytes of low nibbles in Q4_1's order; w = d * (q - 16)
//   (Q5_0) or d * q + m (Q5_1).
// - Q4_K (144 bytes a super-block of 256): fp16 d, fp16 dmin, 12 bytes of 6-bit scale sc and
//   minimum m of each 32 weights, 128 bytes of nibbles (bytes 32 l .. 32 l + 31: weights 64 l
//   + t in the low nibbles, 64 l + 32 + t in the high ones); w = (d sc) q - dmin m.
// - Q5_K (176): as Q4_K with 32 bytes of fifth bits before the nibbles (bit j of byte t:
//   weight 32 j + t).
// - Q6_K (210): 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (one a 16
//   weights), fp16 d last; w = (d sc) (q - 32).
// d sc and (d sc) q are exact in fp32 (at most 11 + 8 + 6 significant bits), so fma(d sc, q,
// -(dmin m)) rounds once, where gguf's reference does.
enum QType : int64_t {
  Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14
};
constexpr const char* TYPES_HELP =
    " (Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14)";

int64_t block_bytes(int64_t qtype) {
  switch (qtype) {
    case Q4_0: return 2 + QK / 2;
    case Q4_1: return 4 + QK / 2;
    case Q5_0: return 6 + QK / 2;
    case Q5_1: return 8 + QK / 2;
    case Q8_0: return 2 + QK;
    case Q4_K: return 4 + 12 + QK_K / 2;
    case Q5_K: return 4 + 12 + QK_K / 8 + QK_K / 2;
    case Q6_K: return QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
    default: return -1;
  }
}

inline bool is_kquant(int64_t qtype) { return qtype == Q4_K || qtype == Q5_K || qtype == Q6_K; }

// Weights a block of ``qtype`` holds: 32, or 256 for a K-quant super-block.
inline int64_t block_weights(int64_t qtype) { return is_kquant(qtype) ? QK_K : QK; }

// Bytes of a row of K weights of ``qtype`` (K a multiple of block_weights).
inline int64_t row_bytes(int64_t qtype, int64_t K) {
  return K / block_weights(qtype) * block_bytes(qtype);
}

template <int64_t T>
using QT = std::integral_constant<int64_t, T>;

// Calls f(QT<qtype>{}): each type's loops are compiled apart, with no type test inside them.
// Callers have checked the type (block_bytes(qtype) > 0).
template <typename F>
void with_qtype(int64_t qtype, F&& f) {
  switch (qtype) {
    case Q4_0: return f(QT<Q4_0>{});
    case Q4_1: return f(QT<Q4_1>{});
    case Q5_0: return f(QT<Q5_0>{});
    case Q5_1: return f(QT<Q5_1>{});
    case Q8_0: return f(QT<Q8_0>{});
    case Q4_K: return f(QT<Q4_K>{});
    case Q5_K: return f(QT<Q5_K>{});
    case Q6_K: return f(QT<Q6_K>{});
    default: throw std::invalid_argument("unsupported GGML type " + std::to_string(qtype) + TYPES_HELP);
  }
}

// IEEE half -> float, portable (no F16C needed).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal half: normalise
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        --exp;
      }
      man &= 0x3ffu;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline uint16_t read_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Ask for ``bytes`` bytes at ``p`` ahead of use, one cache line at a time (a prefetch never
// faults, so the range may run past an allocation). LOCALITY: __builtin_prefetch's hint.
template <int LOCALITY>
inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, LOCALITY);
}

inline float read_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The 6-bit scale and minimum of sub-block j (0..7) of a Q4_K / Q5_K super-block's 12 scale
// bytes (llama.cpp's get_scale_min_k4).
inline void kquant_scale_min(const uint8_t* q, int j, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Dequantize one block to w[block_weights(T)] exactly as gguf's reference dequantization does.
template <int64_t T>
inline void dequantize_block(const uint8_t* b, float* w) {
  if constexpr (T == Q8_0) {
    const float d = half_to_float(read_u16(b));
    const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < QK; ++j) w[j] = d * static_cast<float>(q[j]);
  } else if constexpr (T == Q4_0 || T == Q4_1) {
    const float d = half_to_float(read_u16(b));
    constexpr bool has_min = T == Q4_1;
    const float m = has_min ? half_to_float(read_u16(b + 2)) : 0.0f;
    const uint8_t* qs = b + (has_min ? 4 : 2);
    for (int j = 0; j < QK / 2; ++j) {
      float lo = static_cast<float>(qs[j] & 0x0f);
      float hi = static_cast<float>(qs[j] >> 4);
      if (has_min) {
        w[j] = std::fma(d, lo, m);
        w[j + QK / 2] = std::fma(d, hi, m);
      } else {
        w[j] = d * (lo - 8.0f);
        w[j + QK / 2] = d * (hi - 8.0f);
      }
    }
  } else if constexpr (T == Q5_0 || T == Q5_1) {  // gguf: d * (q - 16), or d * q + m
    const float d = half_to_float(read_u16(b));
    constexpr bool has_min = T == Q5_1;
    const float m = has_min ? half_to_float(read_u16(b + 2)) : 0.0f;
    uint32_t qh;
    std::memcpy(&qh, b + (has_min ? 4 : 2), sizeof(qh));
    const uint8_t* qs = b + (has_min ? 8 : 6);
    for (int j = 0; j < QK / 2; ++j) {
      const float lo = static_cast<float>((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4));
      const float hi = static_cast<float>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
      if (has_min) {
        w[j] = std::fma(d, lo, m);
        w[j + QK / 2] = std::fma(d, hi, m);
      } else {
        w[j] = d * (lo - 16.0f);
        w[j + QK / 2] = d * (hi - 16.0f);
      }
    }
  } else if constexpr (T == Q4_K || T == Q5_K) {  // gguf: (d sc) q - dmin m
    const float d = half_to_float(read_u16(b)), dmin = half_to_float(read_u16(b + 2));
    const uint8_t* sc = b + 4;
    const uint8_t* qh = b + 16;  // Q5_K's fifth bits
    const uint8_t* qs = b + (T == Q5_K ? 48 : 16);
    for (int j = 0; j < QK_K / QK; ++j) {
      uint8_t scale, min;
      kquant_scale_min(sc, j, scale, min);
      const float s = d * static_cast<float>(scale), m = -(dmin * static_cast<float>(min));
      const uint8_t* q = qs + (j / 2) * QK;
      for (int t = 0; t < QK; ++t) {
        int code = j % 2 ? q[t] >> 4 : q[t] & 0x0f;
        if constexpr (T == Q5_K) code |= ((qh[t] >> j) & 1) << 4;
        w[j * QK + t] = std::fma(s, static_cast<float>(code), m);
      }
    }
  } else {  // Q6_K: gguf: (d sc) (q - 32), one scale a 16 weights
    static_assert(T == Q6_K, "a type without a dequantization");
    const uint8_t* ql = b;
    const uint8_t* qh = b + QK_K / 2;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + QK_K / 2 + QK_K / 4);
    const float d = half_to_float(read_u16(b + QK_K / 2 + QK_K / 4 + QK_K / 16));
    for (int i = 0; i < QK_K; ++i) {
      const int half = i / 128, c = (i % 128) / QK, t = i % QK;  // chunk c of 32 in a half
      const uint8_t low = ql[half * 64 + (c % 2) * QK + t];
      const int nibble = c < 2 ? low & 0x0f : low >> 4;
      const int high = (qh[half * QK + t] >> (2 * c)) & 3;
      w[i] = (d * static_cast<float>(sc[i / 16])) * static_cast<float>((nibble | high << 4) - 32);
    }
  }
}

// The kernels' layout: the weight rows in groups of GROUP, each group's blocks interleaved so
// that one vector holds the same weight of GROUP output rows (made once at load by ``pack``).
// A group block is GROUP blocks of the type, field by field: each fp16 header field (d, and m
// or dmin) of the GROUP rows side by side, then each other byte of the block (codes, and the
// K-quants' scales) of the GROUP rows side by side. Same bytes as the rows it comes from, so
// the same bytes a token; rows past N (a last partial group) are zero (weight 0).
// Why: with a row of W a vector, every activation row costs four FMAs a block and a horizontal
// sum, and the activations are re-read for every weight row; with GROUP rows a vector, one FMA
// of a broadcast activation serves GROUP outputs, and a batch of 8 goals keeps the FMA units
// busy.
// GROUP is the vector width in floats: 16 where the compiler has AVX-512 (the machine that
// runs the library built it: half the decoding and broadcast instructions a weight of the
// 8-row AVX2 form, 1.3x its GEMM at 8 goals on a Zen 4 EPYC), else 8. ``pack`` and the kernels
// of one build agree on it; group_rows() tells it.
#if TB_HAVE_AVX2 && defined(__AVX512F__)
#define TB_HAVE_AVX512 1
constexpr int64_t GROUP = 16;
#else
#define TB_HAVE_AVX512 0
constexpr int64_t GROUP = 8;
#endif

struct Fields {
  // A block: n_fields header fields of field_bytes (at byte field_at of the file's block),
  // and code_bytes of codes (at code_at): everything but the header, in the file's order.
  int64_t field_bytes, n_fields, code_bytes, field_at, code_at;
};

Fields block_fields(int64_t qtype) {
  switch (qtype) {
    case Q4_0: return {2, 1, QK / 2, 0, 2};
    case Q4_1: return {2, 2, QK / 2, 0, 4};
    case Q5_0: return {2, 3, QK / 2, 0, 6};  // d, fifth bits of weights 0-15, of 16-31
    case Q5_1: return {2, 4, QK / 2, 0, 8};  // d, m, fifth bits 0-15, 16-31
    case Q8_0: return {2, 1, QK, 0, 2};
    case Q4_K: return {2, 2, 140, 0, 4};  // d, dmin; scales and nibbles
    case Q5_K: return {2, 2, 172, 0, 4};  // d, dmin; scales, fifth bits, nibbles
    default: return {2, 1, 208, 208, 0};  // Q6_K: d (last in the file); everything before it
  }
}

// Copy row ``i``'s block out of a group block ``g`` (GROUP blocks interleaved) to ``out``, in
// the file's layout.
void unpack_block(const uint8_t* g, int64_t qtype, int64_t i, uint8_t* out) {
  const Fields f = block_fields(qtype);
  for (int64_t t = 0; t < f.n_fields; ++t)
    std::memcpy(out + f.field_at + t * f.field_bytes, g + (t * GROUP + i) * f.field_bytes,
                f.field_bytes);
  const uint8_t* codes = g + GROUP * f.n_fields * f.field_bytes;
  uint8_t* out_codes = out + f.code_at;
  for (int64_t j = 0; j < f.code_bytes; ++j) out_codes[j] = codes[j * GROUP + i];
}

// Portable path: output groups [g0, g1) of y, each weight dequantized as gguf does.
template <int64_t T>
void groups_portable_t(const uint8_t* w, const float* x, int64_t M, int64_t K, float* y,
                       int64_t N, int64_t g0, int64_t g1) {
  constexpr int64_t BW = T == Q4_K || T == Q5_K || T == Q6_K ? QK_K : QK;
  const int64_t nb = K / BW, bb = block_bytes(T);
  uint8_t block[MAX_BLOCK_BYTES];
  float wb[BW];
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* grp = w + g * nb * GROUP * bb;
    for (int64_t i = 0; i < GROUP && g * GROUP + i < N; ++i) {
      float acc[MAX_ROWS] = {0};
      for (int64_t b = 0; b < nb; ++b) {
        unpack_block(grp + b * GROUP * bb, T, i, block);
        dequantize_block<T>(block, wb);
        for (int64_t r = 0; r < M; ++r) {
          for (int64_t sub = 0; sub < BW; sub += QK) {  // one sum a 32 weights, as before
            const float* xr = x + r * K + b * BW + sub;
            float s = 0.0f;
            for (int j = 0; j < QK; ++j) s = std::fma(wb[sub + j], xr[j], s);
            acc[r] += s;
          }
        }
      }
      for (int64_t r = 0; r < M; ++r) y[r * N + g * GROUP + i] = acc[r];
    }
  }
}

void groups_portable(int64_t qtype, const uint8_t* w, const float* x, int64_t M, int64_t K,
                     float* y, int64_t N, int64_t g0, int64_t g1) {
  with_qtype(qtype, [&](auto t) {
    groups_portable_t<decltype(t)::value>(w, x, M, K, y, N, g0, g1);
  });
}

#define TB_HAVE_SIMD_GEMM (TB_HAVE_AVX2 || TB_HAVE_NEON)

#if TB_HAVE_SIMD_GEMM
// GROUP floats of one vector and the few operations the kernel needs, for AVX-512 (16),
// AVX2 (8) or NEON (8, as two registers): one kernel template serves all three.
#if TB_HAVE_NEON
struct Lanes {
  struct F {
    float32x4_t lo, hi;
  };
  struct I {
    uint32x4_t lo, hi;
  };
  static F zero() { return {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }
  static F set1(float v) { return {vdupq_n_f32(v), vdupq_n_f32(v)}; }
  static F halves(const uint8_t* p) {  // GROUP fp16 -> fp32 (exact, FCVTL: base AArch64)
    const float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(p));
    return {vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)};
  }
  static F floats(const uint8_t* p) {
    const float* f = reinterpret_cast<const float*>(p);
    return {vld1q_f32(f), vld1q_f32(f + 4)};
  }
  static I bytes_u8(const uint8_t* p) {  // GROUP bytes, zero-extended
    const uint16x8_t w = vmovl_u8(vld1_u8(p));
    return {vmovl_u16(vget_low_u16(w)), vmovl_high_u16(w)};
  }
  static I bytes_i8(const uint8_t* p) {  // GROUP bytes, sign-extended (held as their bits)
    const int16x8_t w = vmovl_s8(vld1_s8(reinterpret_cast<const int8_t*>(p)));
    return {vreinterpretq_u32_s32(vmovl_s16(vget_low_s16(w))),
            vreinterpretq_u32_s32(vmovl_high_s16(w))};
  }
  static I halves_u16(const uint8_t* p) {  // GROUP uint16, zero-extended
    const uint16x8_t w = vld1q_u16(reinterpret_cast<const uint16_t*>(p));
    return {vmovl_u16(vget_low_u16(w)), vmovl_high_u16(w)};
  }
  static uint32x4_t shift(uint32x4_t v, int n) {  // left by n, right by -n
    return vshlq_u32(v, vdupq_n_s32(n));
  }
  static I fifth_bit(I bits, int j) {  // 16 where bit j of bits (j >= 4) is set, else 0
    const uint32x4_t sixteen = vdupq_n_u32(16);
    return {vandq_u32(shift(bits.lo, 4 - j), sixteen), vandq_u32(shift(bits.hi, 4 - j), sixteen)};
  }
  static I or_low(I v, I h) {
    const uint32x4_t m = vdupq_n_u32(15);
    return {vorrq_u32(vandq_u32(v.lo, m), h.lo), vorrq_u32(vandq_u32(v.hi, m), h.hi)};
  }
  static I or_high(I v, I h) {
    return {vorrq_u32(vshrq_n_u32(v.lo, 4), h.lo), vorrq_u32(vshrq_n_u32(v.hi, 4), h.hi)};
  }
  static I shift_left(I v, int n) { return {shift(v.lo, n), shift(v.hi, n)}; }
  static I shift_right(I v, int n) { return {shift(v.lo, -n), shift(v.hi, -n)}; }
  static I and_mask(I v, uint32_t mask) {
    const uint32x4_t m = vdupq_n_u32(mask);
    return {vandq_u32(v.lo, m), vandq_u32(v.hi, m)};
  }
  static I or_bits(I a, I b) { return {vorrq_u32(a.lo, b.lo), vorrq_u32(a.hi, b.hi)}; }
  static I minus(I v, uint32_t k) {  // v - k, two's complement (to_float reads it signed)
    const uint32x4_t m = vdupq_n_u32(k);
    return {vsubq_u32(v.lo, m), vsubq_u32(v.hi, m)};
  }
  static F low_nibbles(I v) {
    const uint32x4_t m = vdupq_n_u32(15);
    return {vcvtq_f32_u32(vandq_u32(v.lo, m)), vcvtq_f32_u32(vandq_u32(v.hi, m))};
  }
  static F high_nibbles(I v) {
    return {vcvtq_f32_u32(vshrq_n_u32(v.lo, 4)), vcvtq_f32_u32(vshrq_n_u32(v.hi, 4))};
  }
  static F to_float(I v) {  // as signed 32-bit integers (bytes_i8's codes are negative)
    return {vcvtq_f32_s32(vreinterpretq_s32_u32(v.lo)),
            vcvtq_f32_s32(vreinterpretq_s32_u32(v.hi))};
  }
  static F fma(F a, F b, F c) {  // a b + c, one rounding, as _mm256_fmadd_ps
    return {vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)};
  }
  static F mul(F a, F b) { return {vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
  static F add(F a, F b) { return {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
  static void store(float* p, F v) {
    vst1q_f32(p, v.lo);
    vst1q_f32(p + 4, v.hi);
  }
};
#elif TB_HAVE_AVX512
struct Lanes {
  using F = __m512;
  using I = __m512i;
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F halves(const uint8_t* p) {  // GROUP fp16 -> fp32
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F floats(const uint8_t* p) { return _mm512_loadu_ps(reinterpret_cast<const float*>(p)); }
  static I bytes_u8(const uint8_t* p) {  // GROUP bytes, zero-extended
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I bytes_i8(const uint8_t* p) {  // GROUP bytes, sign-extended
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I halves_u16(const uint8_t* p) {  // GROUP uint16, zero-extended
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static I fifth_bit(I bits, int j) {  // 16 where bit j of bits is set, else 0
    return _mm512_and_si512(_mm512_srli_epi32(bits, j - 4), _mm512_set1_epi32(16));
  }
  static I or_low(I v, I h) { return _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi32(15)), h); }
  static I or_high(I v, I h) { return _mm512_or_si512(_mm512_srli_epi32(v, 4), h); }
  static I shift_left(I v, int n) { return _mm512_slli_epi32(v, n); }
  static I shift_right(I v, int n) { return _mm512_srli_epi32(v, n); }
  static I and_mask(I v, uint32_t mask) {
    return _mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(mask)));
  }
  static I or_bits(I a, I b) { return _mm512_or_si512(a, b); }
  static I minus(I v, uint32_t k) {
    return _mm512_sub_epi32(v, _mm512_set1_epi32(static_cast<int>(k)));
  }
  static F low_nibbles(I v) {
    return _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
  }
  static F high_nibbles(I v) { return _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)); }
  static F to_float(I v) { return _mm512_cvtepi32_ps(v); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
};
#else
struct Lanes {
  using F = __m256;
  using I = __m256i;
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F halves(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F floats(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static I bytes_u8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I bytes_i8(const uint8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I halves_u16(const uint8_t* p) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I fifth_bit(I bits, int j) {
    return _mm256_and_si256(_mm256_srli_epi32(bits, j - 4), _mm256_set1_epi32(16));
  }
  static I or_low(I v, I h) { return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(15)), h); }
  static I or_high(I v, I h) { return _mm256_or_si256(_mm256_srli_epi32(v, 4), h); }
  static I shift_left(I v, int n) { return _mm256_slli_epi32(v, n); }
  static I shift_right(I v, int n) { return _mm256_srli_epi32(v, n); }
  static I and_mask(I v, uint32_t mask) {
    return _mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(mask)));
  }
  static I or_bits(I a, I b) { return _mm256_or_si256(a, b); }
  static I minus(I v, uint32_t k) {
    return _mm256_sub_epi32(v, _mm256_set1_epi32(static_cast<int>(k)));
  }
  static F low_nibbles(I v) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
  }
  static F high_nibbles(I v) { return _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)); }
  static F to_float(I v) { return _mm256_cvtepi32_ps(v); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
};
#endif
using Vec = Lanes::F;

// The scales and constant of one group block of a 32-weight type, GROUP rows a vector: weight
// k of row i is s[i] * code + c[i]; c = m (Q4_1, Q5_1), -8 d (Q4_0), -16 d (Q5_0), 0 (Q8_0).
// s * code is exact in fp32 (a scale times a code of at most 8 bits), so fma(s, code, c) is
// gguf's dequantized weight.
template <int64_t T>
inline void group_scales(const uint8_t* g, Vec& s, Vec& c) {
  s = Lanes::halves(g);
  if constexpr (T == Q4_1 || T == Q5_1)
    c = Lanes::halves(g + 2 * GROUP);
  else if constexpr (T == Q4_0)
    c = Lanes::mul(s, Lanes::set1(-8.0f));
  else if constexpr (T == Q5_0)  // d * (q - 16) = d * q - 16 d, exact either way
    c = Lanes::mul(s, Lanes::set1(-16.0f));
  else
    c = Lanes::zero();
}

// Output groups [g0, g1) of y (ROWS, N) = x (ROWS, K) W^T: for every weight k, the GROUP
// rows' weights are one vector and each activation row adds x[r][k] times it (a broadcast
// FMA). P accumulators a row keep enough FMAs in flight when the rows are few.
// How far ahead of the block being decoded the weights are asked for, and __builtin_prefetch's
// locality hint. On the Xeon (AVX-512) VM, 8 kB ahead into L2 (hint 1) multiplied the 1.4 B
// Q4_K file's matrices of a type and shape, streamed from memory, in 0.75 (Q4_K) and 0.63
// (Q6_K) of the time of the next block asked for with the non-temporal hint (0) that was
// the default before; 4-16 kB ahead did alike in a sweep by hand, and hint 3 (L1) a little
// worse (benchmarks/results/vnni_decode/). -D overrides both for such a sweep. On the AMD EPYC
// AVX2 VM, 1-4 blocks ahead with hint 0 made no difference; hint 1 was not timed there.
#ifndef TB_PF_AHEAD
#define TB_PF_AHEAD 8192
#define TB_PF_LOC 1
#endif
// Ask for the ``bytes`` lying TB_PF_AHEAD bytes past ``blk`` (at least the next block) in this
// thread's stream of weights.
inline void prefetch_ahead(const uint8_t* blk, int64_t bytes) {
  prefetch_bytes<TB_PF_LOC>(blk + std::max<int64_t>(TB_PF_AHEAD, bytes), bytes);
}

// Accumulators a row: enough FMAs in flight when the rows are few.
template <int64_t ROWS>
constexpr int accumulators() { return ROWS == 1 ? 8 : (ROWS == 2 ? 4 : (ROWS <= 4 ? 2 : 1)); }

// Sum each row's accumulators and store the GROUP outputs of group g (fewer past N).
template <int64_t ROWS, int P>
inline void store_group(Vec (&acc)[ROWS][P], float* y, int64_t N, int64_t g) {
  const int64_t n0 = g * GROUP, valid = std::min(GROUP, N - n0);
  for (int64_t r = 0; r < ROWS; ++r) {
    Vec sum = acc[r][0];
    for (int a = 1; a < P; ++a) sum = Lanes::add(sum, acc[r][a]);
    if (valid == GROUP) {
      Lanes::store(y + r * N + n0, sum);
    } else {
      float lanes[GROUP];
      Lanes::store(lanes, sum);
      std::memcpy(y + r * N + n0, lanes, valid * sizeof(float));
    }
  }
}

// The 32-weight types.
template <int64_t T, int64_t ROWS>
void groups_simd_32(const uint8_t* w, const float* x, int64_t K, float* y, int64_t N,
                    int64_t g0, int64_t g1) {
  constexpr int P = accumulators<ROWS>();
  constexpr bool nibbles = T == Q4_0 || T == Q4_1;
  constexpr bool fifth = T == Q5_0 || T == Q5_1;
  const Fields f = block_fields(T);
  const int64_t nb = K / QK, bb = block_bytes(T), header = GROUP * f.n_fields * f.field_bytes;
  for (int64_t g = g0; g < g1; ++g) {
    Vec acc[ROWS][P];
    for (int64_t r = 0; r < ROWS; ++r)
      for (int a = 0; a < P; ++a) acc[r][a] = Lanes::zero();
    const uint8_t* grp = w + g * nb * GROUP * bb;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = grp + b * GROUP * bb;
      // The weights are read once a step, from memory: ask for the block PREFETCH_BLOCKS
      // ahead in this thread's stream (the hardware prefetcher alone left the 8-goal GEMMs
      // of a real step ~1.5x slower than with the weights in cache).
      prefetch_ahead(blk, GROUP * bb);
      Vec s, c;
      group_scales<T>(blk, s, c);
      const uint8_t* codes = blk + header;
      const float* xb = x + b * QK;
      if constexpr (fifth) {  // nibbles as Q4_1, plus bit j (j + 16) of the fifth bits
        const int64_t bits = (T == Q5_1 ? 2 : 1) * 2 * GROUP;  // offset of the fifth bits
        const auto h_lo = Lanes::halves_u16(blk + bits);
        const auto h_hi = Lanes::halves_u16(blk + bits + 2 * GROUP);
#pragma GCC unroll 16
        for (int j = 0; j < QK / 2; ++j) {
          const auto v = Lanes::bytes_u8(codes + j * GROUP);
          // (bits >> j) & 1, moved to 16: shift left by 4 first where j < 4.
          const auto b_lo = j >= 4 ? Lanes::fifth_bit(h_lo, j)
                                   : Lanes::fifth_bit(Lanes::shift_left(h_lo, 4), j + 4);
          const auto b_hi = j >= 4 ? Lanes::fifth_bit(h_hi, j)
                                   : Lanes::fifth_bit(Lanes::shift_left(h_hi, 4), j + 4);
          const Vec w_lo = Lanes::fma(s, Lanes::to_float(Lanes::or_low(v, b_lo)), c);
          const Vec w_hi = Lanes::fma(s, Lanes::to_float(Lanes::or_high(v, b_hi)), c);
          for (int64_t r = 0; r < ROWS; ++r) {
            Vec& a_lo = acc[r][(2 * j) % P];
            a_lo = Lanes::fma(Lanes::set1(xb[r * K + j]), w_lo, a_lo);
            Vec& a_hi = acc[r][(2 * j + 1) % P];
            a_hi = Lanes::fma(Lanes::set1(xb[r * K + j + QK / 2]), w_hi, a_hi);
          }
        }
      } else if constexpr (nibbles) {  // byte j: weight j (low nibble) and j + 16 (high) of each row
#pragma GCC unroll 16
        for (int j = 0; j < QK / 2; ++j) {
          const auto v = Lanes::bytes_u8(codes + j * GROUP);
          const Vec w_lo = Lanes::fma(s, Lanes::low_nibbles(v), c);
          const Vec w_hi = Lanes::fma(s, Lanes::high_nibbles(v), c);
          for (int64_t r = 0; r < ROWS; ++r) {
            Vec& a_lo = acc[r][(2 * j) % P];
            a_lo = Lanes::fma(Lanes::set1(xb[r * K + j]), w_lo, a_lo);
            Vec& a_hi = acc[r][(2 * j + 1) % P];
            a_hi = Lanes::fma(Lanes::set1(xb[r * K + j + QK / 2]), w_hi, a_hi);
          }
        }
      } else {  // Q8_0: byte k is weight k of each row, int8
#pragma GCC unroll 32
        for (int k = 0; k < QK; ++k) {
          const Vec wk = Lanes::fma(s, Lanes::to_float(Lanes::bytes_i8(codes + k * GROUP)), c);
          for (int64_t r = 0; r < ROWS; ++r) {
            Vec& a = acc[r][k % P];
            a = Lanes::fma(Lanes::set1(xb[r * K + k]), wk, a);
          }
        }
      }
    }
    store_group<ROWS, P>(acc, y, N, g);
  }
}

// Q4_K / Q5_K from the file's super-blocks: per pair of sub-blocks (64 weights), their two
// scales and minima (6-bit fields of the 12 scale bytes, GROUP rows a vector), then 32 code
// bytes: weight t of the first sub-block in the low nibble, of the second in the high one
// (Q5_K: the fifth bit from bit j of byte t of qh).
inline void kquant_fields(const uint8_t* sc, int j, typename Lanes::I& scale,
                          typename Lanes::I& min) {
  using I = typename Lanes::I;
  if (j < 4) {
    scale = Lanes::and_mask(Lanes::bytes_u8(sc + j * GROUP), 63);
    min = Lanes::and_mask(Lanes::bytes_u8(sc + (j + 4) * GROUP), 63);
  } else {
    const I q_hi = Lanes::bytes_u8(sc + (j + 4) * GROUP);
    const I top_s = Lanes::shift_left(Lanes::shift_right(Lanes::bytes_u8(sc + (j - 4) * GROUP), 6), 4);
    const I top_m = Lanes::shift_left(Lanes::shift_right(Lanes::bytes_u8(sc + j * GROUP), 6), 4);
    scale = Lanes::or_bits(Lanes::and_mask(q_hi, 15), top_s);
    min = Lanes::or_bits(Lanes::shift_right(q_hi, 4), top_m);
  }
}

// Sub-block j's scale d sc and constant -dmin m, GROUP rows a vector.
inline void kquant_pair(const uint8_t* sc, int j, Vec d, Vec dmin, Vec& s, Vec& c) {
  typename Lanes::I scale, min;
  kquant_fields(sc, j, scale, min);
  s = Lanes::mul(d, Lanes::to_float(scale));  // exact: fp16 times 6 bits
  c = Lanes::mul(Lanes::mul(dmin, Lanes::to_float(min)), Lanes::set1(-1.0f));
}

// The fifth bit of sub-block j (bit j of each byte of h) moved to bit 4.
inline typename Lanes::I fifth_of(typename Lanes::I h, int j) {
  return Lanes::and_mask(j >= 4 ? Lanes::shift_right(h, j - 4) : Lanes::shift_left(h, 4 - j), 16);
}

// Q4_K / Q5_K: the codes at byte t of pair l's 32 (``q``: the pair's nibbles, ``qh``: Q5_K's
// fifth bits): sub-block 2 l's in ``lo``, 2 l + 1's in ``hi``, GROUP rows a vector.
template <int64_t T>
inline void k4_codes(const uint8_t* q, const uint8_t* qh, int l, int t, typename Lanes::I& lo,
                     typename Lanes::I& hi) {
  const auto v = Lanes::bytes_u8(q + t * GROUP);
  lo = Lanes::and_mask(v, 15);
  hi = Lanes::shift_right(v, 4);
  if constexpr (T == Q5_K) {
    const auto h = Lanes::bytes_u8(qh + t * GROUP);
    lo = Lanes::or_bits(lo, fifth_of(h, 2 * l));
    hi = Lanes::or_bits(hi, fifth_of(h, 2 * l + 1));
  }
}

// Q6_K: the 6-bit codes 0..63 of weights 128 half + 32 c + t, c = 0..3, GROUP rows a vector.
inline void q6_codes(const uint8_t* ql, const uint8_t* qh, int half, int t,
                     typename Lanes::I (&q)[4]) {
  const auto a = Lanes::bytes_u8(ql + (64 * half + t) * GROUP);
  const auto bq = Lanes::bytes_u8(ql + (64 * half + QK + t) * GROUP);
  const auto h = Lanes::bytes_u8(qh + (QK * half + t) * GROUP);
  q[0] = Lanes::or_bits(Lanes::and_mask(a, 15), Lanes::and_mask(Lanes::shift_left(h, 4), 48));
  q[1] = Lanes::or_bits(Lanes::and_mask(bq, 15), Lanes::and_mask(Lanes::shift_left(h, 2), 48));
  q[2] = Lanes::or_bits(Lanes::shift_right(a, 4), Lanes::and_mask(h, 48));
  q[3] = Lanes::or_bits(Lanes::shift_right(bq, 4), Lanes::and_mask(Lanes::shift_right(h, 2), 48));
}

template <int64_t T, int64_t ROWS>
void groups_simd_k4(const uint8_t* w, const float* x, int64_t K, float* y, int64_t N,
                    int64_t g0, int64_t g1) {
  constexpr int P = accumulators<ROWS>();
  constexpr bool five = T == Q5_K;
  const int64_t nb = K / QK_K, bb = block_bytes(T);
  for (int64_t g = g0; g < g1; ++g) {
    Vec acc[ROWS][P];
    for (int64_t r = 0; r < ROWS; ++r)
      for (int a = 0; a < P; ++a) acc[r][a] = Lanes::zero();
    const uint8_t* grp = w + g * nb * GROUP * bb;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = grp + b * GROUP * bb;
      prefetch_ahead(blk, GROUP * bb);
      const Vec d = Lanes::halves(blk), dmin = Lanes::halves(blk + 2 * GROUP);
      const uint8_t* sc = blk + 4 * GROUP;
      const uint8_t* qh = sc + 12 * GROUP;
      const uint8_t* qs = sc + (five ? 44 : 12) * GROUP;
      const float* xb = x + b * QK_K;
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) {
        Vec s0, c0, s1, c1;
        kquant_pair(sc, 2 * l, d, dmin, s0, c0);
        kquant_pair(sc, 2 * l + 1, d, dmin, s1, c1);
        const uint8_t* q = qs + l * QK * GROUP;
        const float* xl = xb + l * 2 * QK;
        // Four code bytes an iteration, unrolled: every accumulator index a constant (an
        // index the compiler cannot resolve puts the accumulators on the stack).
        for (int t0 = 0; t0 < QK; t0 += 4) {
#pragma GCC unroll 4
          for (int u = 0; u < 4; ++u) {
            const int t = t0 + u;
            typename Lanes::I lo, hi;
            k4_codes<T>(q, qh, l, t, lo, hi);
            const Vec w_lo = Lanes::fma(s0, Lanes::to_float(lo), c0);
            const Vec w_hi = Lanes::fma(s1, Lanes::to_float(hi), c1);
            for (int64_t r = 0; r < ROWS; ++r) {
              Vec& a_lo = acc[r][(2 * u) % P];
              a_lo = Lanes::fma(Lanes::set1(xl[r * K + t]), w_lo, a_lo);
              Vec& a_hi = acc[r][(2 * u + 1) % P];
              a_hi = Lanes::fma(Lanes::set1(xl[r * K + QK + t]), w_hi, a_hi);
            }
          }
        }
      }
    }
    store_group<ROWS, P>(acc, y, N, g);
  }
}

// A Q6_K group super-block's fields: d (GROUP fp16 as floats), then ql (128 GROUP bytes:
// low nibbles), qh (64 GROUP: the top 2 bits) and sc (16 GROUP int8 scales).
struct Q6Block {
  Vec d;
  const uint8_t* ql;
  const uint8_t* qh;
  const uint8_t* sc;
};

inline Q6Block q6_block(const uint8_t* blk) {
  const uint8_t* ql = blk + 2 * GROUP;
  return {Lanes::halves(blk), ql, ql + 128 * GROUP, ql + 192 * GROUP};
}

// Q6_K from the file's super-blocks: per half (128 weights) and per 16 code positions t, the
// four scales of chunks c = 0..3 (weights 32 c + t); low nibbles from ql, two high bits from qh.
template <int64_t ROWS>
void groups_simd_k6(const uint8_t* w, const float* x, int64_t K, float* y, int64_t N,
                    int64_t g0, int64_t g1) {
  constexpr int P = accumulators<ROWS>();
  const int64_t nb = K / QK_K, bb = block_bytes(Q6_K);
  const Vec minus32 = Lanes::set1(-32.0f);
  for (int64_t g = g0; g < g1; ++g) {
    Vec acc[ROWS][P];
    for (int64_t r = 0; r < ROWS; ++r)
      for (int a = 0; a < P; ++a) acc[r][a] = Lanes::zero();
    const uint8_t* grp = w + g * nb * GROUP * bb;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = grp + b * GROUP * bb;
      prefetch_ahead(blk, GROUP * bb);
      const auto [d, ql, qh, sc] = q6_block(blk);
      const float* xb = x + b * QK_K;
      for (int half = 0; half < 2; ++half) {
        for (int u = 0; u < 2; ++u) {
          Vec s[4];
          for (int c = 0; c < 4; ++c)  // exact: fp16 times an int8
            s[c] = Lanes::mul(d, Lanes::to_float(
                Lanes::bytes_i8(sc + (8 * half + 2 * c + u) * GROUP)));
          const float* xh = xb + half * 128;
          for (int t0 = 16 * u; t0 < 16 * u + 16; t0 += 2) {
#pragma GCC unroll 2
           for (int v = 0; v < 2; ++v) {  // constant accumulator indices, as in groups_simd_k4
            const int t = t0 + v;
            typename Lanes::I q[4];
            q6_codes(ql, qh, half, t, q);
            for (int c = 0; c < 4; ++c) {  // (d sc) (q - 32): both exact, as gguf's
              const Vec wc = Lanes::mul(s[c], Lanes::add(Lanes::to_float(q[c]), minus32));
              for (int64_t r = 0; r < ROWS; ++r) {
                Vec& acc_c = acc[r][(4 * v + c) % P];
                acc_c = Lanes::fma(Lanes::set1(xh[r * K + c * QK + t]), wc, acc_c);
              }
            }
           }
          }
        }
      }
    }
    store_group<ROWS, P>(acc, y, N, g);
  }
}

// Decoding (ROWS <= 2) with the scales outside the sums. A Q4_K / Q5_K weight is s q + c per
// 32-weight sub-block (c = -dmin m), so a sub-block's share of x . w is s (x . q) + c sum(x):
// the codes are multiplied as they are (one conversion and one FMA a weight and row, where
// dequantizing costs a third operation; timebill_ros/bench/studies/decode_types.py) and each sub-block's sum
// is scaled once (Q6_K: groups_simd_k6_scaled). Still fp32 throughout, rounded in another
// order than dequantize-then-multiply (the tests' tolerance). The sums of x over each SPAN
// weights, once a call: sums[r * (K / SPAN) + j] (ROWS, K / SPAN), in this thread's scratch.
template <int64_t ROWS, int SPAN>
inline const float* span_sums(const float* x, int64_t K) {
  const int64_t n = K / SPAN;
  float* sums = scratch(SPANS, ROWS * n);
  for (int64_t r = 0; r < ROWS; ++r)
    for (int64_t j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int t = 0; t < SPAN; ++t) s += x[r * K + j * SPAN + t];
      sums[r * n + j] = s;
    }
  return sums;
}

// The walk of every one- or two-row decoding kernel of a K-quant: for each output group in
// [g0, g1), its super-blocks in order (the weights asked for ahead), ``block(blk, b, acc)``
// adding super-block b's share to the group's two accumulators a row; then the group's
// outputs stored.
template <int64_t ROWS, typename Block>
inline void walk_super_blocks(const uint8_t* w, int64_t K, int64_t bb, float* y, int64_t N,
                              int64_t g0, int64_t g1, Block&& block) {
  const int64_t nb = K / QK_K;
  for (int64_t g = g0; g < g1; ++g) {
    Vec acc[ROWS][2];
    for (int64_t r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = Lanes::zero();
    const uint8_t* grp = w + g * nb * GROUP * bb;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = grp + b * GROUP * bb;
      prefetch_ahead(blk, GROUP * bb);
      block(blk, b, acc);
    }
    store_group<ROWS, 2>(acc, y, N, g);
  }
}

template <int64_t T, int64_t ROWS>
void groups_simd_k4_sums(const uint8_t* w, const float* x, int64_t K, float* y, int64_t N,
                         int64_t g0, int64_t g1) {
  static_assert(ROWS <= 2, "more rows share one dequantization: groups_simd_k4");
  constexpr int Q = ROWS == 1 ? 4 : 2;  // chains a sub-block and row: 2 Q ROWS FMAs in flight
  const int64_t bb = block_bytes(T), ns = K / QK;
  const float* sums = span_sums<ROWS, QK>(x, K);
  walk_super_blocks<ROWS>(w, K, bb, y, N, g0, g1, [&](const uint8_t* blk, int64_t b,
                                                    Vec (&acc)[ROWS][2]) {
    const Vec d = Lanes::halves(blk), dmin = Lanes::halves(blk + 2 * GROUP);
    const uint8_t* sc = blk + 4 * GROUP;
    const uint8_t* qh = sc + 12 * GROUP;
    const uint8_t* qs = sc + (T == Q5_K ? 44 : 12) * GROUP;
    const float* xb = x + b * QK_K;
    for (int l = 0; l < 4; ++l) {
      Vec lo[ROWS][Q], hi[ROWS][Q];  // x . q of sub-blocks 2 l and 2 l + 1
      for (int64_t r = 0; r < ROWS; ++r)
        for (int a = 0; a < Q; ++a) lo[r][a] = hi[r][a] = Lanes::zero();
      const uint8_t* q = qs + l * QK * GROUP;
      const float* xl = xb + l * 2 * QK;
      for (int t0 = 0; t0 < QK; t0 += Q) {
#pragma GCC unroll 4
        for (int u = 0; u < Q; ++u) {  // constant chain indices, as in groups_simd_k4
          const int t = t0 + u;
          typename Lanes::I c_lo, c_hi;
          k4_codes<T>(q, qh, l, t, c_lo, c_hi);
          const Vec f_lo = Lanes::to_float(c_lo), f_hi = Lanes::to_float(c_hi);
          for (int64_t r = 0; r < ROWS; ++r) {
            lo[r][u] = Lanes::fma(Lanes::set1(xl[r * K + t]), f_lo, lo[r][u]);
            hi[r][u] = Lanes::fma(Lanes::set1(xl[r * K + QK + t]), f_hi, hi[r][u]);
          }
        }
      }
      Vec s0, c0, s1, c1;
      kquant_pair(sc, 2 * l, d, dmin, s0, c0);
      kquant_pair(sc, 2 * l + 1, d, dmin, s1, c1);
      for (int64_t r = 0; r < ROWS; ++r) {
        Vec dot_lo = lo[r][0], dot_hi = hi[r][0];
        for (int a = 1; a < Q; ++a) {
          dot_lo = Lanes::add(dot_lo, lo[r][a]);
          dot_hi = Lanes::add(dot_hi, hi[r][a]);
        }
        const float* sum = sums + r * ns + b * (QK_K / QK) + 2 * l;
        acc[r][0] = Lanes::fma(c0, Lanes::set1(sum[0]), Lanes::fma(s0, dot_lo, acc[r][0]));
        acc[r][1] = Lanes::fma(c1, Lanes::set1(sum[1]), Lanes::fma(s1, dot_hi, acc[r][1]));
      }
    }
  });
}

#if TB_HAVE_AVX512 && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
#define TB_HAVE_VNNI_K4 1
// Decoding Q4_K with integer dot products (AVX-512 VNNI: vpdpbusd multiplies 4 unsigned bytes
// by 4 signed bytes and adds them to a 32-bit lane, 64 products an instruction). The fp32
// path (groups_simd_k4_sums) spends a conversion, an FMA, a broadcast and a share of the
// nibble unpacking on every 16 weights and is bound by that arithmetic, not by the bytes it
// reads; llama.cpp's int8 path is bound by the bytes, but it rounds x to 8 bits (its answers
// leave fp32's). Here x is not rounded: each 32-weight span of x is written exactly enough as
// three signed 8-bit parts, x = u0 p0 + u1 p1 + u2 p2 + e with u0 = max|x| / 127,
// u1 = u0 / 254, u2 = u1 / 254 and |e| <= u2 / 2 ~ 2^-24 max|x| (fp32's own rounding of the
// largest value), and each part's code products are summed exactly in int32 (at most
// 32 * 15 * 127 a span). A span's x . q is then sum_p u_p S_p in fp32, smallest first: the
// same products as dequantize-then-multiply, summed in another order (the tests' tolerance).
constexpr int X_PARTS = 3;

// The parts of x (ROWS, K): parts[(r * X_PARTS + p) * K + k], units[(r * K / QK + j) *
// X_PARTS + p] for span j (QK weights) of row r.
template <int64_t ROWS>
inline void split_activations(const float* x, int64_t K, int8_t* parts, float* units) {
  const int64_t ns = K / QK;
  for (int64_t r = 0; r < ROWS; ++r)
    for (int64_t j = 0; j < ns; ++j) {
      float rest[QK], amax = 0.0f;
      for (int t = 0; t < QK; ++t) {
        rest[t] = x[r * K + j * QK + t];
        amax = std::max(amax, std::fabs(rest[t]));
      }
      float unit = amax > 0.0f ? amax / 127.0f : 1.0f;
      for (int p = 0; p < X_PARTS; ++p, unit /= 254.0f) {
        units[(r * ns + j) * X_PARTS + p] = unit;
        int8_t* out = parts + (r * X_PARTS + p) * K + j * QK;
        for (int t = 0; t < QK; ++t) {  // the part, then what it leaves (one rounding)
          const float q = std::min(127.0f, std::max(-127.0f, std::nearbyint(rest[t] / unit)));
          out[t] = static_cast<int8_t>(q);
          rest[t] = std::fma(-q, unit, rest[t]);
        }
      }
    }
}

// A 64-byte load of the packed codes holds positions t0..t0+3 of the 16 rows (byte 16 v + i:
// position t0 + v, row i); vpdpbusd wants row i's 4 positions in its lane i: byte 4 i + v.
inline __m512i vnni_order() {
  alignas(64) uint8_t order[64];
  for (int i = 0; i < 16; ++i)
    for (int v = 0; v < 4; ++v) order[4 * i + v] = static_cast<uint8_t>(16 * v + i);
  return _mm512_load_si512(order);
}

// The 64 packed code bytes at p (positions t0..t0+3 of the 16 rows) in vpdpbusd's order.
inline __m512i codes_in_lanes(const uint8_t* p, __m512i order) {
  return _mm512_permutexvar_epi8(order, _mm512_loadu_si512(p));
}

// The 4 bytes at p (4 positions of one part of x) in every lane.
inline __m512i x4_bytes(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

template <int64_t ROWS>
void groups_vnni_q4k(const uint8_t* w, const float* x, int64_t K, float* y, int64_t N,
                     int64_t g0, int64_t g1) {
  const int64_t bb = block_bytes(Q4_K), ns = K / QK;
  const float* sums = span_sums<ROWS, QK>(x, K);
  int8_t* parts = reinterpret_cast<int8_t*>(scratch(XPARTS, ROWS * X_PARTS * K / 4 + 1));
  float* units = scratch(XUNITS, ROWS * ns * X_PARTS);
  split_activations<ROWS>(x, K, parts, units);
  const __m512i order = vnni_order();
  const __m512i m4 = _mm512_set1_epi8(15);
  walk_super_blocks<ROWS>(w, K, bb, y, N, g0, g1, [&](const uint8_t* blk, int64_t b,
                                                    Vec (&acc)[ROWS][2]) {
    const Vec d = Lanes::halves(blk), dmin = Lanes::halves(blk + 2 * GROUP);
    const uint8_t* sc = blk + 4 * GROUP;
    const uint8_t* qs = sc + 12 * GROUP;
    for (int l = 0; l < 4; ++l) {
      __m512i lo[ROWS][X_PARTS], hi[ROWS][X_PARTS];  // sub-blocks 2 l and 2 l + 1
      for (int64_t r = 0; r < ROWS; ++r)
        for (int p = 0; p < X_PARTS; ++p) lo[r][p] = hi[r][p] = _mm512_setzero_si512();
      const uint8_t* q = qs + l * QK * GROUP;
      for (int t0 = 0; t0 < QK; t0 += 4) {
        const __m512i v = codes_in_lanes(q + t0 * GROUP, order);
        const __m512i c_lo = _mm512_and_si512(v, m4);
        const __m512i c_hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        for (int64_t r = 0; r < ROWS; ++r)
          for (int p = 0; p < X_PARTS; ++p) {
            const int8_t* xp = parts + (r * X_PARTS + p) * K + b * QK_K + l * 2 * QK + t0;
            lo[r][p] = _mm512_dpbusd_epi32(lo[r][p], c_lo, x4_bytes(xp));
            hi[r][p] = _mm512_dpbusd_epi32(hi[r][p], c_hi, x4_bytes(xp + QK));
          }
      }
      Vec s0, c0, s1, c1;
      kquant_pair(sc, 2 * l, d, dmin, s0, c0);
      kquant_pair(sc, 2 * l + 1, d, dmin, s1, c1);
      for (int64_t r = 0; r < ROWS; ++r) {
        const float* u = units + (r * ns + b * (QK_K / QK) + 2 * l) * X_PARTS;
        Vec dot_lo = Lanes::zero(), dot_hi = Lanes::zero();
        for (int p = X_PARTS - 1; p >= 0; --p) {  // smallest part first
          dot_lo = Lanes::fma(Lanes::set1(u[p]), Lanes::to_float(lo[r][p]), dot_lo);
          dot_hi = Lanes::fma(Lanes::set1(u[X_PARTS + p]), Lanes::to_float(hi[r][p]), dot_hi);
        }
        const float* sum = sums + r * ns + b * (QK_K / QK) + 2 * l;
        acc[r][0] = Lanes::fma(c0, Lanes::set1(sum[0]), Lanes::fma(s0, dot_lo, acc[r][0]));
        acc[r][1] = Lanes::fma(c1, Lanes::set1(sum[1]), Lanes::fma(s1, dot_hi, acc[r][1]));
      }
    }
  });
}

// Q6_K's 6-bit codes of chunk c (weights 128 half + 32 c + t) in byte lanes, from ``low``
// (the low-nibble bytes: ql's first 32 of the half for even c, its second 32 for odd c) and
// ``high`` (qh's bytes of the half). Shifts are of 16-bit lanes; the bits one carries across
// a byte are masked off.
inline __m512i q6_code_bytes(__m512i low, __m512i high, int c) {
  const __m512i nib = c < 2 ? low : _mm512_srli_epi16(low, 4);
  const __m512i top = c == 0 ? _mm512_slli_epi16(high, 4)
                    : c == 1 ? _mm512_slli_epi16(high, 2)
                    : c == 2 ? high : _mm512_srli_epi16(high, 2);
  return _mm512_or_si512(_mm512_and_si512(nib, _mm512_set1_epi8(15)),
                         _mm512_and_si512(top, _mm512_set1_epi8(48)));
}

// Q6_K the same way: codes q = 0..63 (unsigned bytes) times x's parts, and (q - 32) . x_p =
// q . x_p - 32 sum(x_p), both in int32 (exact; sum over the 16 weights of one scale).
template <int64_t ROWS>
void groups_vnni_q6k(const uint8_t* w, const float* x, int64_t K, float* y, int64_t N,
                     int64_t g0, int64_t g1) {
  const int64_t bb = block_bytes(Q6_K), ns = K / QK, n16 = K / 16;
  int8_t* parts = reinterpret_cast<int8_t*>(scratch(XPARTS, ROWS * X_PARTS * K / 4 + 1));
  float* units = scratch(XUNITS, ROWS * ns * X_PARTS);
  split_activations<ROWS>(x, K, parts, units);
  int32_t* part_sums = reinterpret_cast<int32_t*>(scratch(XSUMS, ROWS * X_PARTS * n16));
  for (int64_t rp = 0; rp < ROWS * X_PARTS; ++rp)
    for (int64_t j = 0; j < n16; ++j) {
      int32_t sum = 0;
      for (int t = 0; t < 16; ++t) sum += parts[rp * K + 16 * j + t];
      part_sums[rp * n16 + j] = 32 * sum;
    }
  const __m512i order = vnni_order();
  walk_super_blocks<ROWS>(w, K, bb, y, N, g0, g1, [&](const uint8_t* blk, int64_t b,
                                                    Vec (&acc)[ROWS][2]) {
    const auto [d, ql, qh, sc] = q6_block(blk);
    for (int half = 0; half < 2; ++half) {
      for (int u = 0; u < 2; ++u) {  // weights 32 c + 16 u .. + 16 of each chunk c: one scale
        __m512i part[ROWS][4][X_PARTS];
        for (int64_t r = 0; r < ROWS; ++r)
          for (int c = 0; c < 4; ++c)
            for (int p = 0; p < X_PARTS; ++p) part[r][c][p] = _mm512_setzero_si512();
        for (int t0 = 16 * u; t0 < 16 * u + 16; t0 += 4) {
          const __m512i a = codes_in_lanes(ql + (64 * half + t0) * GROUP, order);
          const __m512i bq = codes_in_lanes(ql + (64 * half + QK + t0) * GROUP, order);
          const __m512i h = codes_in_lanes(qh + (QK * half + t0) * GROUP, order);
          __m512i q[4];
          for (int c = 0; c < 4; ++c) q[c] = q6_code_bytes(c % 2 ? bq : a, h, c);
          for (int64_t r = 0; r < ROWS; ++r)
            for (int c = 0; c < 4; ++c)
              for (int p = 0; p < X_PARTS; ++p)
                part[r][c][p] = _mm512_dpbusd_epi32(part[r][c][p], q[c], x4_bytes(
                    parts + (r * X_PARTS + p) * K + b * QK_K + 128 * half + 32 * c + t0));
        }
        for (int c = 0; c < 4; ++c) {  // (d sc) x . (q - 32); d sc exact
          const Vec s = Lanes::mul(d, Lanes::to_float(
              Lanes::bytes_i8(sc + (8 * half + 2 * c + u) * GROUP)));
          const int64_t j16 = (b * QK_K + 128 * half + 32 * c + 16 * u) / 16;
          for (int64_t r = 0; r < ROWS; ++r) {
            const float* unit = units + (r * ns + j16 / 2) * X_PARTS;
            Vec dot = Lanes::zero();
            for (int p = X_PARTS - 1; p >= 0; --p) {  // smallest part first
              const __m512i centred = _mm512_sub_epi32(
                  part[r][c][p], _mm512_set1_epi32(part_sums[(r * X_PARTS + p) * n16 + j16]));
              dot = Lanes::fma(Lanes::set1(unit[p]), Lanes::to_float(centred), dot);
            }
            acc[r][c & 1] = Lanes::fma(s, dot, acc[r][c & 1]);
          }
        }
      }
    }
  });
}
#else
#define TB_HAVE_VNNI_K4 0
#endif

#if TB_HAVE_AVX2 && !TB_HAVE_AVX512
// Q6_K's codes on AVX2 in byte lanes: one 32-byte load of ql's low nibbles, of its high ones
// and of qh holds positions t0..t0+3 of the 8 rows, so the 6-bit codes of 4 positions x 4
// chunks are put together and moved to q - 32 (signed) with ~1.3 integer operations a vector
// of 8 codes (q6_codes' 32-bit lanes take ~4.5), then sign-extended a position at a time.
// Codes of chunks c = 0..3 at positions t0..t0+3 (byte 8 v + i: position t0 + v, row i).
inline void q6_codes_bytes(const uint8_t* ql, const uint8_t* qh, int half, int t0,
                           __m256i (&q)[4]) {
  const auto load = [](const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  };
  const __m256i a = load(ql + (64 * half + t0) * GROUP);
  const __m256i b = load(ql + (64 * half + QK + t0) * GROUP);
  const __m256i h = load(qh + (QK * half + t0) * GROUP);
  const __m256i m4 = _mm256_set1_epi8(15), m48 = _mm256_set1_epi8(48);
  const __m256i c32 = _mm256_set1_epi8(32);
  // Shifts are of 16-bit lanes; the bits one carries across a byte are masked off.
  const auto code = [&](__m256i low, __m256i high) {
    return _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(low, m4),
                                           _mm256_and_si256(high, m48)), c32);
  };
  q[0] = code(a, _mm256_slli_epi16(h, 4));  // qh bits 0-1
  q[1] = code(b, _mm256_slli_epi16(h, 2));  // bits 2-3
  q[2] = code(_mm256_srli_epi16(a, 4), h);  // bits 4-5
  q[3] = code(_mm256_srli_epi16(b, 4), _mm256_srli_epi16(h, 2));  // bits 6-7
}

// The 8 codes of position t0 + V of a q6_codes_bytes vector, as floats.
template <int V>
inline __m256 position_codes(__m256i q) {
  const __m128i half = V < 2 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(V % 2 ? _mm_srli_si128(half, 8) : half));
}

#endif

// part[r][c][V % P] += x[r][c * QK + t0 + V] (q_c - 32) at position t0 + V; f(c): the
// floats of chunk c's codes there.
template <int64_t ROWS, int P, int V, typename F>
inline void add_position(F&& f, const float* xt, int64_t K, Vec (&part)[ROWS][4][P]) {
  for (int c = 0; c < 4; ++c) {
    const Vec codes = f(c);
    for (int64_t r = 0; r < ROWS; ++r)
      part[r][c][V % P] = Lanes::fma(Lanes::set1(xt[r * K + c * QK + V]), codes,
                                     part[r][c][V % P]);
  }
}

// x . (q - 32) of positions t0..t0+3, 16 u <= t0 < 16 u + 16 (see groups_simd_k6_scaled).
template <int64_t ROWS, int P>
inline void k6_positions(const uint8_t* ql, const uint8_t* qh, int half, int t0,
                         const float* xt, int64_t K, Vec (&part)[ROWS][4][P]) {
#if TB_HAVE_AVX2 && !TB_HAVE_AVX512
  __m256i q[4];
  q6_codes_bytes(ql, qh, half, t0, q);
  add_position<ROWS, P, 0>([&](int c) { return position_codes<0>(q[c]); }, xt, K, part);
  add_position<ROWS, P, 1>([&](int c) { return position_codes<1>(q[c]); }, xt, K, part);
  add_position<ROWS, P, 2>([&](int c) { return position_codes<2>(q[c]); }, xt, K, part);
  add_position<ROWS, P, 3>([&](int c) { return position_codes<3>(q[c]); }, xt, K, part);
#else
  typename Lanes::I q[4][4];
  for (int v = 0; v < 4; ++v) q6_codes(ql, qh, half, t0 + v, q[v]);
  const auto codes = [&](int v, int c) { return Lanes::to_float(Lanes::minus(q[v][c], 32)); };
  add_position<ROWS, P, 0>([&](int c) { return codes(0, c); }, xt, K, part);
  add_position<ROWS, P, 1>([&](int c) { return codes(1, c); }, xt, K, part);
  add_position<ROWS, P, 2>([&](int c) { return codes(2, c); }, xt, K, part);
  add_position<ROWS, P, 3>([&](int c) { return codes(3, c); }, xt, K, part);
#endif
}

// Decoding (ROWS <= 2) of Q6_K with each 16-weight scale outside its sum: (d sc) x . (q - 32),
// the codes moved to q - 32 as integers (exact) and multiplied as they are; on AVX2 built in
// byte lanes (q6_codes_bytes).
template <int64_t ROWS>
void groups_simd_k6_scaled(const uint8_t* w, const float* x, int64_t K, float* y, int64_t N,
                           int64_t g0, int64_t g1) {
  static_assert(ROWS <= 2, "more rows share one dequantization: groups_simd_k6");
  constexpr int P = ROWS == 1 ? 2 : 1;  // chains a chunk and row: 4 P ROWS in flight
  const int64_t bb = block_bytes(Q6_K);
  walk_super_blocks<ROWS>(w, K, bb, y, N, g0, g1, [&](const uint8_t* blk, int64_t b,
                                                    Vec (&acc)[ROWS][2]) {
    const auto [d, ql, qh, sc] = q6_block(blk);
    for (int half = 0; half < 2; ++half) {
      const float* xh = x + b * QK_K + half * 128;
      for (int u = 0; u < 2; ++u) {  // weights 32 c + 16 u .. + 16 of each chunk c: one scale
        Vec part[ROWS][4][P];
        for (int64_t r = 0; r < ROWS; ++r)
          for (int c = 0; c < 4; ++c)
            for (int v = 0; v < P; ++v) part[r][c][v] = Lanes::zero();
        for (int t0 = 16 * u; t0 < 16 * u + 16; t0 += 4)
          k6_positions<ROWS, P>(ql, qh, half, t0, xh + t0, K, part);
        for (int c = 0; c < 4; ++c) {  // (d sc) x . (q - 32); d sc exact
          const Vec s = Lanes::mul(d, Lanes::to_float(
              Lanes::bytes_i8(sc + (8 * half + 2 * c + u) * GROUP)));
          for (int64_t r = 0; r < ROWS; ++r) {
            Vec dot = part[r][c][0];
            for (int v = 1; v < P; ++v) dot = Lanes::add(dot, part[r][c][v]);
            acc[r][c & 1] = Lanes::fma(s, dot, acc[r][c & 1]);
          }
        }
      }
    }
  });
}

template <int64_t T, int64_t ROWS>
void groups_simd_fixed(const uint8_t* w, const float* x, int64_t K, float* y, int64_t N,
                       int64_t g0, int64_t g1) {
#if TB_HAVE_VNNI_K4
  if constexpr (T == Q4_K && ROWS <= 2)
    groups_vnni_q4k<ROWS>(w, x, K, y, N, g0, g1);
  else if constexpr (T == Q6_K && ROWS <= 2)
    groups_vnni_q6k<ROWS>(w, x, K, y, N, g0, g1);
  else
#endif
  if constexpr ((T == Q4_K || T == Q5_K) && ROWS <= 2)
    groups_simd_k4_sums<T, ROWS>(w, x, K, y, N, g0, g1);
  else if constexpr (T == Q4_K || T == Q5_K)
    groups_simd_k4<T, ROWS>(w, x, K, y, N, g0, g1);
  else if constexpr (T == Q6_K && ROWS <= 2)
    groups_simd_k6_scaled<ROWS>(w, x, K, y, N, g0, g1);
  else if constexpr (T == Q6_K)
    groups_simd_k6<ROWS>(w, x, K, y, N, g0, g1);
  else
    groups_simd_32<T, ROWS>(w, x, K, y, N, g0, g1);
}

template <int64_t T>
void groups_simd_t(const uint8_t* w, const float* x, int64_t M, int64_t K, float* y, int64_t N,
                   int64_t g0, int64_t g1) {
  switch (M) {
    case 1: return groups_simd_fixed<T, 1>(w, x, K, y, N, g0, g1);
    case 2: return groups_simd_fixed<T, 2>(w, x, K, y, N, g0, g1);
    case 3: return groups_simd_fixed<T, 3>(w, x, K, y, N, g0, g1);
    case 4: return groups_simd_fixed<T, 4>(w, x, K, y, N, g0, g1);
    case 5: return groups_simd_fixed<T, 5>(w, x, K, y, N, g0, g1);
    case 6: return groups_simd_fixed<T, 6>(w, x, K, y, N, g0, g1);
    case 7: return groups_simd_fixed<T, 7>(w, x, K, y, N, g0, g1);
    default: return groups_simd_fixed<T, 8>(w, x, K, y, N, g0, g1);
  }
}

// The type chosen once per call, outside the loops.
void groups_simd(int64_t qtype, const uint8_t* w, const float* x, int64_t M, int64_t K,
                 float* y, int64_t N, int64_t g0, int64_t g1) {
  with_qtype(qtype, [&](auto t) {
    groups_simd_t<decltype(t)::value>(w, x, M, K, y, N, g0, g1);
  });
}
#endif

#if TB_HAVE_SIMD_GEMM
// --- The prefill's GEMM: any number of activation rows, on the blocks ---------------------
// y (M, N) = x (M, K) W^T for a prefill chunk, reading W's blocks directly: for each panel of
// up to PANEL_K weights (one K-quant super-block, or 8 blocks of 32) and each group of GROUP
// output rows, the group's weights are dequantized once into a small fp32 panel (PANEL_K x
// GROUP, in L1) and multiplied with MC rows of x, MR rows at a time (GROUP outputs a vector,
// one broadcast FMA a weight and row). No dequantized matrix is written to memory.
// Each output is summed in a fixed order, whatever M, the row's place in the chunk, MC or the
// threads: k in order within a panel (from 0), then the panels' sums in order. A row's result
// depends on that row alone: any chunk plan gives the same logits.
constexpr int64_t PANEL_K = 256;  // weights of a panel
constexpr int64_t MC = 64;        // x rows a pass over the panels (their panel slices in L2)
constexpr int64_t MR = 6;         // x rows a micro-kernel (MR accumulators and one weight)

// Every weight of one group block of a 32-weight type as a vector of its GROUP rows:
// out[k * GROUP + i] = weight k of row i, as gguf dequantizes it.
template <int64_t T>
inline void block_vectors_32(const uint8_t* blk, float* out) {
  Vec s, c;
  group_scales<T>(blk, s, c);
  const Fields f = block_fields(T);
  const uint8_t* codes = blk + GROUP * f.n_fields * f.field_bytes;
  if constexpr (T == Q5_0 || T == Q5_1) {
    const int64_t bits = (T == Q5_1 ? 2 : 1) * 2 * GROUP;
    const auto h_lo = Lanes::halves_u16(blk + bits);
    const auto h_hi = Lanes::halves_u16(blk + bits + 2 * GROUP);
    for (int j = 0; j < QK / 2; ++j) {
      const auto v = Lanes::bytes_u8(codes + j * GROUP);
      const auto b_lo = j >= 4 ? Lanes::fifth_bit(h_lo, j)
                               : Lanes::fifth_bit(Lanes::shift_left(h_lo, 4), j + 4);
      const auto b_hi = j >= 4 ? Lanes::fifth_bit(h_hi, j)
                               : Lanes::fifth_bit(Lanes::shift_left(h_hi, 4), j + 4);
      Lanes::store(out + j * GROUP, Lanes::fma(s, Lanes::to_float(Lanes::or_low(v, b_lo)), c));
      Lanes::store(out + (j + QK / 2) * GROUP,
                   Lanes::fma(s, Lanes::to_float(Lanes::or_high(v, b_hi)), c));
    }
  } else if constexpr (T == Q4_0 || T == Q4_1) {
    for (int j = 0; j < QK / 2; ++j) {
      const auto v = Lanes::bytes_u8(codes + j * GROUP);
      Lanes::store(out + j * GROUP, Lanes::fma(s, Lanes::low_nibbles(v), c));
      Lanes::store(out + (j + QK / 2) * GROUP, Lanes::fma(s, Lanes::high_nibbles(v), c));
    }
  } else {
    for (int k = 0; k < QK; ++k)
      Lanes::store(out + k * GROUP,
                   Lanes::fma(s, Lanes::to_float(Lanes::bytes_i8(codes + k * GROUP)), c));
  }
}

// The same for a Q4_K / Q5_K super-block (256 weights).
template <int64_t T>
inline void block_vectors_k4(const uint8_t* blk, float* out) {
  const Vec d = Lanes::halves(blk), dmin = Lanes::halves(blk + 2 * GROUP);
  const uint8_t* sc = blk + 4 * GROUP;
  const uint8_t* qh = sc + 12 * GROUP;
  const uint8_t* qs = sc + (T == Q5_K ? 44 : 12) * GROUP;
  for (int l = 0; l < 4; ++l) {
    Vec s0, c0, s1, c1;
    kquant_pair(sc, 2 * l, d, dmin, s0, c0);
    kquant_pair(sc, 2 * l + 1, d, dmin, s1, c1);
    const uint8_t* q = qs + l * QK * GROUP;
    for (int t = 0; t < QK; ++t) {
      typename Lanes::I lo, hi;
      k4_codes<T>(q, qh, l, t, lo, hi);
      Lanes::store(out + (2 * l * QK + t) * GROUP, Lanes::fma(s0, Lanes::to_float(lo), c0));
      Lanes::store(out + ((2 * l + 1) * QK + t) * GROUP, Lanes::fma(s1, Lanes::to_float(hi), c1));
    }
  }
}

// The same for a Q6_K super-block.
inline void block_vectors_k6(const uint8_t* blk, float* out) {
  const auto [d, ql, qh, sc] = q6_block(blk);
  const Vec minus32 = Lanes::set1(-32.0f);
  for (int half = 0; half < 2; ++half)
    for (int u = 0; u < 2; ++u) {
      Vec s[4];
      for (int c = 0; c < 4; ++c)
        s[c] = Lanes::mul(d, Lanes::to_float(Lanes::bytes_i8(sc + (8 * half + 2 * c + u) * GROUP)));
      for (int t = 16 * u; t < 16 * u + 16; ++t) {
        typename Lanes::I q[4];
        q6_codes(ql, qh, half, t, q);
        for (int c = 0; c < 4; ++c)
          Lanes::store(out + (128 * half + c * QK + t) * GROUP,
                       Lanes::mul(s[c], Lanes::add(Lanes::to_float(q[c]), minus32)));
      }
    }
}

// Panel ``p`` of group ``g`` (weights [p PANEL_K, p PANEL_K + pk)) as GROUP-row vectors.
template <int64_t T>
inline int64_t group_panel(const uint8_t* w, int64_t K, int64_t g, int64_t p, float* out) {
  const int64_t bb = block_bytes(T), bw = block_weights(T), nb = K / bw;
  const int64_t first = p * PANEL_K / bw, last = std::min(nb, (p + 1) * PANEL_K / bw);
  const uint8_t* grp = w + g * nb * GROUP * bb;
  for (int64_t b = first; b < last; ++b) {
    float* o = out + (b - first) * bw * GROUP;
    if constexpr (T == Q4_K || T == Q5_K)
      block_vectors_k4<T>(grp + b * GROUP * bb, o);
    else if constexpr (T == Q6_K)
      block_vectors_k6(grp + b * GROUP * bb, o);
    else
      block_vectors_32<T>(grp + b * GROUP * bb, o);
  }
  return (last - first) * bw;
}

// ROWS rows of x (row stride K) times NG groups' panels of pk weights (group j's panel at
// panel + j PANEL_K GROUP): y rows (stride ldy; group j's outputs at + j GROUP) += (or =, for
// the first panel) their sums, each summed over k in order from 0. Two groups make ROWS x 2
// accumulators (6 x 2 = 12 of AVX2's 16 registers): two weight loads and ROWS broadcasts feed
// 2 ROWS FMAs, enough to keep both FMA ports busy; one group (ROWS loads and broadcasts for
// ROWS FMAs) waits on the load ports. The grouping changes no output's summation order.
template <int ROWS, int NG>
inline void panel_rows(const float* panel, int64_t pk, const float* x, int64_t K, float* y,
                       int64_t ldy, bool first) {
  Vec acc[ROWS][NG];
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < NG; ++j) acc[r][j] = Lanes::zero();
  for (int64_t k = 0; k < pk; ++k) {
    Vec wk[NG];
    for (int j = 0; j < NG; ++j)
      wk[j] = Lanes::floats(reinterpret_cast<const uint8_t*>(panel + j * PANEL_K * GROUP +
                                                             k * GROUP));
    for (int r = 0; r < ROWS; ++r) {
      const Vec xr = Lanes::set1(x[r * K + k]);
      for (int j = 0; j < NG; ++j) acc[r][j] = Lanes::fma(xr, wk[j], acc[r][j]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < NG; ++j) {
      float* out = y + r * ldy + j * GROUP;
      Lanes::store(out, first ? acc[r][j]
                              : Lanes::add(Lanes::floats(reinterpret_cast<const uint8_t*>(out)),
                                           acc[r][j]));
    }
}

template <int NG>
inline void panel_rows_n(int rows, const float* panel, int64_t pk, const float* x, int64_t K,
                         float* y, int64_t ldy, bool first) {
  switch (rows) {
    case 1: return panel_rows<1, NG>(panel, pk, x, K, y, ldy, first);
    case 2: return panel_rows<2, NG>(panel, pk, x, K, y, ldy, first);
    case 3: return panel_rows<3, NG>(panel, pk, x, K, y, ldy, first);
    case 4: return panel_rows<4, NG>(panel, pk, x, K, y, ldy, first);
    case 5: return panel_rows<5, NG>(panel, pk, x, K, y, ldy, first);
    default: return panel_rows<MR, NG>(panel, pk, x, K, y, ldy, first);
  }
}

// Groups [g0, g1) of y (M, N) = x (M, K) W^T, any M (see PANEL_K above).
template <int64_t T>
void groups_tiled_t(const uint8_t* w, const float* x, int64_t M, int64_t K, float* y,
                    int64_t N, int64_t g0, int64_t g1) {
  float* panel = scratch(PANEL, 2 * PANEL_K * GROUP);
  float* tail = scratch(TAIL, MC * GROUP);  // the outputs of a last group past N
  const int64_t n_panels = (K + PANEL_K - 1) / PANEL_K;
  for (int64_t m0 = 0; m0 < M; m0 += MC) {
    const int64_t rows = std::min(MC, M - m0);
    for (int64_t p = 0; p < n_panels; ++p) {
      for (int64_t g = g0; g < g1;) {
        const int64_t pk = group_panel<T>(w, K, g, p, panel);
        const float* xp = x + m0 * K + p * PANEL_K;
        if (g + 1 < g1 && (g + 2) * GROUP <= N) {  // two whole groups
          group_panel<T>(w, K, g + 1, p, panel + PANEL_K * GROUP);
          float* out = y + m0 * N + g * GROUP;
          for (int64_t r = 0; r < rows; r += MR)
            panel_rows_n<2>(static_cast<int>(std::min(MR, rows - r)), panel, pk, xp + r * K,
                            K, out + r * N, N, p == 0);
          g += 2;
          continue;
        }
        const bool partial = (g + 1) * GROUP > N;
        float* out = partial ? tail : y + m0 * N + g * GROUP;
        const int64_t ldy = partial ? GROUP : N;
        for (int64_t r = 0; r < rows; r += MR)
          panel_rows_n<1>(static_cast<int>(std::min(MR, rows - r)), panel, pk, xp + r * K, K,
                          out + r * ldy, ldy, p == 0);
        g += 1;
      }
    }
    if ((g1 * GROUP) > N) {  // the last group's valid outputs
      const int64_t n0 = (g1 - 1) * GROUP;
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(y + (m0 + r) * N + n0, tail + r * GROUP, (N - n0) * sizeof(float));
    }
  }
}
#endif

#if TB_HAVE_VNNI_K4 && defined(__AMX_TILE__) && defined(__AMX_INT8__) && !defined(TB_NO_AMX)
#define TB_HAVE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
// --- The prefill's Q4_K / Q6_K GEMM on AMX tiles (Intel Sapphire Rapids and later) ---------
// Why by hand: the fp32 tiled GEMM above was 94 % of a 1.5 B Q4_K file's prefill and 1.2x
// llama.cpp's on the Xeon VM; AMX's tile multiply (TDPBSUD: 16 x 64 signed bytes times
// 64 x 16 unsigned bytes into 16 x 16 int32, ~1 T products a second a core, measured) does
// that arithmetic ~25x faster than fp32 FMAs, and no maintained library multiplies the
// K-quants' own blocks by fp32 activations on it (oneDNN's int8 GEMMs take 8-bit
// activations, as llama.cpp's AMX path does).
// x is not rounded to 8 bits: as in groups_vnni_q4k, each token's 256 values over one
// super-block are three signed 8-bit parts, x = u0 p0 + u1 p1 + u2 p2 + e (u0 = max|x| / 127,
// u1 = u0 / 254, u2 = u1 / 254, |e| <= ~u2 / 2 ~ 2^-24 max|x|). The weights are integers V
// split into a low and a high byte: Q4_K's sc q (6-bit scale times 4-bit code, < 1024), Q6_K's
// sc (q - 32) + 4096 (int8 scale, 6-bit code: 32..8192). A part's products with them are
// summed exactly in int32 over the super-block (Q6_K: less 4096 sum(p)), then scaled once:
// y += d (u2 S2 + u1 S1 + u0 S0) [- dmin sum_j m_j xsum_j for Q4_K], in fp32, in that order.
// A token's result depends on its own x alone (integer sums are exact, its fp32 sums run in
// one order): any chunk plan gives the same bits.
constexpr int64_t AMX_TOKENS = 16;  // tokens of a tile (rows of A and C); two tiles a step
constexpr int64_t AMX_MC = 128;     // tokens a pass over the weights (B tiles made once a pass)
constexpr int64_t AMX_TILE = 1024;  // bytes of a tile: 16 rows of 64
constexpr int64_t AMX_B = 8 * AMX_TILE;  // one super-block's B tiles: 4 pairs x low / high

// Steps of two token tiles that M tokens take.
inline int64_t amx_steps(int64_t M) { return (M + 2 * AMX_TOKENS - 1) / (2 * AMX_TOKENS); }

// ``n`` values of type V in ``slot``'s scratch (see scratch), the first at a 64-byte line.
template <typename V>
V* aligned_scratch(Scratch slot, int64_t n) {
  float* p = scratch(slot, (n * static_cast<int64_t>(sizeof(V)) + 64 + 3) / 4);
  return reinterpret_cast<V*>(reinterpret_cast<uint8_t*>(p) +
                              (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64);
}

// Whether this process may use the tiles: Linux hands them out on request (arch_prctl).
bool amx_granted() {
  static const bool granted = [] {
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return granted;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: the sums of token tiles 0 / 1 with the low / high bytes; 4-5: A; 6-7: B.
inline void amx_configure() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
}

// Bytes of one step's A tiles for one super-block: parts x pairs x two token tiles of 16 x 64.
constexpr int64_t AMX_A = X_PARTS * 4 * 2 * AMX_TILE;

// x (M, K) as the tiles read it, each tile's 16 x 64 bytes contiguous (a strided tile load,
// row by row out of (M, K) parts, ran at half the speed): the A tiles of step s (tokens
// 32 s .. 32 s + 31), super-block b at parts + (s nb + b) AMX_A, part p, pair l and token tile
// t at + ((p 4 + l) 2 + t) 1024, token r's 64 values at + 64 r (tokens past M zero).
// units[(m * nb + b) * 3 + p] for super-block b, each part's sum over it at the same index of
// part_sums, and the fp32 sums of x over each 32 values: sums[m * K / QK + j].
void amx_activations(const float* x, int64_t M, int64_t K, int8_t* parts, float* units,
                     int32_t* part_sums, float* sums) {
  const int64_t nb = K / QK_K, steps = amx_steps(M);
  if (M % (2 * AMX_TOKENS)) std::memset(parts + (steps - 1) * nb * AMX_A, 0, nb * AMX_A);
  parallel_for(M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t b = 0; b < nb; ++b) {
        const float* xs = x + m * K + b * QK_K;
        __m512 rest[QK_K / 16], amax = _mm512_setzero_ps();
        for (int v = 0; v < QK_K / 16; ++v) {
          rest[v] = _mm512_loadu_ps(xs + 16 * v);
          amax = _mm512_max_ps(amax, _mm512_abs_ps(rest[v]));
        }
        for (int j = 0; j < QK_K / QK; ++j)  // in one order: the same bits for any M
          sums[m * (K / QK) + b * (QK_K / QK) + j] =
              _mm512_reduce_add_ps(_mm512_add_ps(rest[2 * j], rest[2 * j + 1]));
        const float top = _mm512_reduce_max_ps(amax);
        int8_t* tiles = parts + ((m / (2 * AMX_TOKENS)) * nb + b) * AMX_A +
                        ((m / AMX_TOKENS) % 2) * AMX_TILE + (m % AMX_TOKENS) * 64;
        float unit = top > 0.0f ? top / 127.0f : 1.0f;
        for (int p = 0; p < X_PARTS; ++p, unit /= 254.0f) {
          units[(m * nb + b) * X_PARTS + p] = unit;
          const __m512 u = _mm512_set1_ps(unit), inv = _mm512_set1_ps(1.0f / unit);
          const __m512 lim = _mm512_set1_ps(127.0f);
          __m512 total = _mm512_setzero_ps();  // whole numbers below 2^15: exact
          for (int v = 0; v < QK_K / 16; ++v) {  // the part, then what it leaves (one rounding)
            __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(rest[v], inv),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q = _mm512_max_ps(_mm512_min_ps(q, lim), _mm512_sub_ps(_mm512_setzero_ps(), lim));
            int8_t* out = tiles + (p * 4 + v / 4) * 2 * AMX_TILE + 16 * (v % 4);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                             _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(q)));
            rest[v] = _mm512_fnmadd_ps(q, u, rest[v]);
            total = _mm512_add_ps(total, q);
          }
          part_sums[(m * nb + b) * X_PARTS + p] =
              static_cast<int32_t>(_mm512_reduce_add_ps(total));
        }
      }
  });
}

// The weights V of 64 code bytes (c: 4 codes a 32-bit lane, s16: the lane's row scale in both
// 16-bit halves; Q4_K: V = sc q, Q6_K: V = sc (q - 32) + 4096, both 0..8192): the low bytes
// to ``lo``, the high ones to ``hi``, 64 each.
template <int64_t T>
inline void scaled_code_bytes(__m512i c, __m512i s16, uint8_t* lo, uint8_t* hi) {
  const __m512i low = _mm512_set1_epi16(0x00FF);
  const auto value = [&](__m512i q) {
    if constexpr (T == Q6_K)
      return _mm512_add_epi16(_mm512_mullo_epi16(_mm512_sub_epi16(q, _mm512_set1_epi16(32)),
                                                 s16), _mm512_set1_epi16(4096));
    else
      return _mm512_mullo_epi16(q, s16);
  };
  const __m512i even = value(_mm512_and_si512(c, low));
  const __m512i odd = value(_mm512_srli_epi16(c, 8));
  _mm512_store_si512(lo, _mm512_or_si512(_mm512_and_si512(even, low), _mm512_slli_epi16(odd, 8)));
  _mm512_store_si512(hi, _mm512_or_si512(_mm512_srli_epi16(even, 8),
                                         _mm512_andnot_si512(low, odd)));
}

// A 32-bit lane's value (a row's scale) in both of its 16-bit halves.
inline __m512i both_halves(__m512i v) {
  return _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(v, 16));
}

// One Q4_K group super-block's B tiles: pair l's low bytes at tiles + 2 l AMX_B / 8, its high
// bytes after them; row r of a tile holds positions 64 l + 4 r .. + 3 of the pair (rows 0-7:
// sub-block 2 l, 8-15: 2 l + 1), of every row of the group (bytes 4 i .. 4 i + 3: row i).
inline void amx_q4k_weights(const uint8_t* blk, uint8_t* tiles, __m512i order) {
  const uint8_t* sc = blk + 4 * GROUP;
  const uint8_t* qs = sc + 12 * GROUP;
  const __m512i m4 = _mm512_set1_epi8(15);
  for (int l = 0; l < 4; ++l) {
    __m512i s[2], unused;
    kquant_fields(sc, 2 * l, s[0], unused);
    kquant_fields(sc, 2 * l + 1, s[1], unused);
    for (auto& v : s) v = both_halves(v);
    uint8_t* lo = tiles + 2 * l * AMX_TILE;
    uint8_t* hi = lo + AMX_TILE;
    for (int r = 0; r < 8; ++r) {
      const __m512i v = codes_in_lanes(qs + (l * QK + 4 * r) * GROUP, order);
      scaled_code_bytes<Q4_K>(_mm512_and_si512(v, m4), s[0], lo + 64 * r, hi + 64 * r);
      scaled_code_bytes<Q4_K>(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), s[1],
                              lo + 64 * (r + 8), hi + 64 * (r + 8));
    }
  }
}

// The same for a Q6_K group super-block: pair l holds weights 128 h + 32 c + t (h = l / 2,
// c = 2 (l % 2) and c + 1 for rows 0-7 and 8-15), each 4 positions under one of the 16 scales.
inline void amx_q6k_weights(const uint8_t* blk, uint8_t* tiles, __m512i order) {
  const auto [d, ql, qh, sc] = q6_block(blk);
  (void)d;
  for (int l = 0; l < 4; ++l) {
    const int half = l / 2;
    uint8_t* lo = tiles + 2 * l * AMX_TILE;
    uint8_t* hi = lo + AMX_TILE;
    for (int r = 0; r < 16; ++r) {
      const int c = 2 * (l % 2) + r / 8, t0 = 4 * (r % 8);
      const __m512i q = q6_code_bytes(
          codes_in_lanes(ql + (64 * half + (c % 2) * QK + t0) * GROUP, order),
          codes_in_lanes(qh + (QK * half + t0) * GROUP, order), c);
      const __m512i s = both_halves(Lanes::bytes_i8(sc + (8 * half + 2 * c + t0 / 16) * GROUP));
      scaled_code_bytes<Q6_K>(q, s, lo + 64 * r, hi + 64 * r);
    }
  }
}

// The int32 sums of two token tiles with one super-block's B tiles: sums[((2 p + t) * 2 + h)
// * 256 + 16 r + i] for part p, tile t, byte h (0 low, 1 high), token r of the tile, row i;
// ``a``: the step's A tiles of the super-block (amx_activations). One part at a time, each A
// and B tile loaded once a pair and used twice.
inline void amx_tile_sums(const int8_t* a, const uint8_t* b, int32_t* sums) {
  for (int p = 0; p < X_PARTS; ++p) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int l = 0; l < 4; ++l) {
      const int8_t* al = a + (p * 4 + l) * 2 * AMX_TILE;
      _tile_loadd(4, al, 64);
      _tile_loadd(6, b + 2 * l * AMX_TILE, 64);
      _tile_loadd(7, b + (2 * l + 1) * AMX_TILE, 64);
      _tile_loadd(5, al + AMX_TILE, 64);
      _tile_dpbsud(0, 4, 6);
      _tile_dpbsud(1, 4, 7);
      _tile_dpbsud(2, 5, 6);
      _tile_dpbsud(3, 5, 7);
    }
    int32_t* out = sums + 4 * 256 * p;
    _tile_stored(0, out, 64); _tile_stored(1, out + 256, 64);
    _tile_stored(2, out + 512, 64); _tile_stored(3, out + 768, 64);
  }
}

// Groups [g0, g1) of y (M, N) = x (M, K) W^T for Q4_K or Q6_K, x prepared by amx_activations.
template <int64_t T>
void groups_amx(const uint8_t* w, const int8_t* parts, const float* units,
                const int32_t* part_sums, const float* xsums, int64_t M, int64_t K, float* y,
                int64_t N, int64_t g0, int64_t g1) {
  const int64_t bb = block_bytes(T), nb = K / QK_K, ns = K / QK;
  uint8_t* tiles = aligned_scratch<uint8_t>(ATILES, AMX_B + 12 * AMX_TILE);  // B, then sums
  int32_t* sums = reinterpret_cast<int32_t*>(tiles + AMX_B);
  float* out = aligned_scratch<float>(AOUT, (g1 - g0) * AMX_MC * GROUP);
  const __m512i order = vnni_order();
  amx_configure();
  for (int64_t m0 = 0; m0 < M; m0 += AMX_MC) {
    const int64_t rows = std::min(AMX_MC, M - m0);
    const int64_t steps = amx_steps(rows);
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t g = g0; g < g1; ++g) {
        const uint8_t* blk = w + (g * nb + b) * GROUP * bb;
        const Vec d = Lanes::halves(blk);  // Q4_K's d and Q6_K's both lead the group block
        Vec c[QK_K / QK];  // Q4_K: each sub-block's -dmin m
        if constexpr (T == Q4_K) {
          amx_q4k_weights(blk, tiles, order);
          const Vec dmin = Lanes::halves(blk + 2 * GROUP);
          for (int j = 0; j < QK_K / QK; ++j) {
            Vec scale;
            kquant_pair(blk + 4 * GROUP, j, d, dmin, scale, c[j]);
          }
        } else {
          amx_q6k_weights(blk, tiles, order);
        }
        float* acc = out + (g - g0) * AMX_MC * GROUP;
        for (int64_t t = 0; t < steps; ++t) {
          const int64_t m = m0 + 2 * t * AMX_TOKENS;
          amx_tile_sums(parts + (m / (2 * AMX_TOKENS) * nb + b) * AMX_A, tiles, sums);
          const int64_t n_tok = std::min(2 * AMX_TOKENS, M - m);
          for (int64_t r = 0; r < n_tok; ++r) {
            const int64_t at = ((m + r) * nb + b) * X_PARTS;
            const int32_t* tile = sums + (r / AMX_TOKENS) * 512 + 16 * (r % AMX_TOKENS);
            Vec dot = Lanes::zero();
            for (int p = X_PARTS - 1; p >= 0; --p) {  // smallest part first
              const __m512i lo = _mm512_load_si512(tile + 4 * 256 * p);  // amx_tile_sums
              const __m512i hi = _mm512_load_si512(tile + 4 * 256 * p + 256);
              __m512i part = _mm512_add_epi32(lo, _mm512_slli_epi32(hi, 8));
              if constexpr (T == Q6_K)
                part = _mm512_sub_epi32(part, _mm512_set1_epi32(4096 * part_sums[at + p]));
              dot = Lanes::fma(Lanes::set1(units[at + p]), Lanes::to_float(part), dot);
            }
            Vec v = Lanes::mul(d, dot);
            if constexpr (T == Q4_K) {
              const float* xs = xsums + (m + r) * ns + b * (QK_K / QK);
              for (int j = 0; j < QK_K / QK; ++j) v = Lanes::fma(c[j], Lanes::set1(xs[j]), v);
            }
            float* a = acc + (2 * t * AMX_TOKENS + r) * GROUP;
            Lanes::store(a, b == 0 ? v : Lanes::add(Lanes::floats(
                                                        reinterpret_cast<const uint8_t*>(a)), v));
          }
        }
      }
    for (int64_t g = g0; g < g1; ++g) {  // the group's outputs (those < N) into y
      const __mmask16 valid = static_cast<__mmask16>((1u << std::min(GROUP, N - g * GROUP)) - 1);
      for (int64_t r = 0; r < rows; ++r)
        _mm512_mask_storeu_ps(y + (m0 + r) * N + g * GROUP, valid,
                              _mm512_load_ps(out + ((g - g0) * AMX_MC + r) * GROUP));
    }
  }
  _tile_release();
}

// Tokens whose split x one call holds (3 bytes a value: 3 * 512 * 8960 = 14 MB for
// Qwen2.5-1.5B's ffn_down); a longer chunk runs in blocks of it. The scratch is kept for the
// thread's next call, so this bounds what a long prefill leaves resident.
constexpr int64_t AMX_BLOCK_TOKENS = 512;

// y (M, N) = x (M, K) W^T for Q4_K or Q6_K on the tiles; false (nothing done) for another
// type or where this process may not use them.
bool gemm_amx(int64_t qtype, const uint8_t* w, const float* x, int64_t M, int64_t K, float* y,
              int64_t N) {
  if ((qtype != Q4_K && qtype != Q6_K) || !amx_granted()) return false;
  const int64_t steps = amx_steps(std::min(M, AMX_BLOCK_TOKENS));
  const int64_t Mp = 2 * AMX_TOKENS * steps;
  int8_t* parts = aligned_scratch<int8_t>(APARTS, steps * (K / QK_K) * AMX_A);
  float* units = scratch(AUNITS, Mp * (K / QK_K) * X_PARTS);
  float* xsums = scratch(ASUMS, Mp * (K / QK));
  int32_t* part_sums = reinterpret_cast<int32_t*>(scratch(APSUMS, Mp * (K / QK_K) * X_PARTS));
  for (int64_t m0 = 0; m0 < M; m0 += AMX_BLOCK_TOKENS) {  // a token's result is its own
    const int64_t rows = std::min(AMX_BLOCK_TOKENS, M - m0);
    amx_activations(x + m0 * K, rows, K, parts, units, part_sums, xsums);
    parallel_for((N + GROUP - 1) / GROUP, 1, [&](int64_t g0, int64_t g1) {
      if (qtype == Q4_K)
        groups_amx<Q4_K>(w, parts, units, part_sums, xsums, rows, K, y + m0 * N, N, g0, g1);
      else
        groups_amx<Q6_K>(w, parts, units, part_sums, xsums, rows, K, y + m0 * N, N, g0, g1);
    });
  }
  return true;
}
#else
#define TB_HAVE_AMX 0
#endif

void unpack_rows_raw(const uint8_t* packed, int64_t qtype, int64_t K, const int64_t* index,
                     int64_t R, float* out);

// Portable path of the prefill GEMM: each row of W dequantized (as gguf does), then its dot
// with every row of x, k in order.
void rows_tiled_portable(int64_t qtype, const uint8_t* w, const float* x, int64_t M, int64_t K,
                         float* y, int64_t N, int64_t n0, int64_t n1) {
  std::vector<float> row(K);
  for (int64_t n = n0; n < n1; ++n) {
    unpack_rows_raw(w, qtype, K, &n, 1, row.data());
    for (int64_t r = 0; r < M; ++r) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s = std::fma(row[k], x[r * K + k], s);
      y[r * N + n] = s;
    }
  }
}

// y (M, N) = x (M, K) W^T for any M >= 1 (a prefill chunk), W packed (``pack``); groups of
// output rows split over the calling thread's pool.
void gemm_tiled_raw(int64_t qtype, const uint8_t* w, const float* x, int64_t M, int64_t K,
                    float* y, int64_t N, bool portable) {
  const int64_t n_groups = (N + GROUP - 1) / GROUP;
#if TB_HAVE_AMX
  if (!portable && gemm_amx(qtype, w, x, M, K, y, N)) return;
#endif
#if TB_HAVE_SIMD_GEMM
  if (!portable) {
    with_qtype(qtype, [&](auto t) {
      parallel_for(n_groups, 1, [&](int64_t g0, int64_t g1) {
        groups_tiled_t<decltype(t)::value>(w, x, M, K, y, N, g0, g1);
      });
    });
    return;
  }
#endif
  (void)n_groups;
  rows_tiled_portable(qtype, w, x, M, K, y, N, 0, N);
}

// y (M, N) = x (M, K) W^T over raw pointers, W packed (``pack``); groups of GROUP output
// rows split over the calling thread's pool.
void gemm_raw(int64_t qtype, const uint8_t* w, const float* xp, int64_t M, int64_t K,
              float* yp, int64_t N, bool portable) {
  const bool use_simd = TB_HAVE_SIMD_GEMM && !portable;
  parallel_for((N + GROUP - 1) / GROUP, 2, [&](int64_t g0, int64_t g1) {
#if TB_HAVE_SIMD_GEMM
    if (use_simd) {
      groups_simd(qtype, w, xp, M, K, yp, N, g0, g1);
      return;
    }
#endif
    groups_portable(qtype, w, xp, M, K, yp, N, g0, g1);
  });
  (void)use_simd;
}

// The kernels' layout of ``src`` (N rows of K weights of type ``qtype``, row after row as the
// GGUF holds them) into ``dst``: ceil(N / GROUP) group rows of GROUP * row_bytes(qtype, K),
// which the caller zeroed (rows past N weigh 0).
void pack_raw(const uint8_t* src, int64_t N, int64_t qtype, int64_t K, uint8_t* dst) {
  const int64_t bb = block_bytes(qtype), nb = K / block_weights(qtype);
  const Fields f = block_fields(qtype);
  const int64_t header = f.n_fields * f.field_bytes;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t g = n / GROUP, i = n % GROUP;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = src + n * nb * bb + b * bb;
      uint8_t* grp = dst + (g * nb + b) * GROUP * bb;
      for (int64_t t = 0; t < f.n_fields; ++t)
        std::memcpy(grp + (t * GROUP + i) * f.field_bytes, blk + f.field_at + t * f.field_bytes,
                    f.field_bytes);
      for (int64_t j = 0; j < f.code_bytes; ++j)
        grp[GROUP * header + j * GROUP + i] = blk[f.code_at + j];
    }
  }
}

// ``src`` (N rows of K weights of type ``qtype``, as the file holds them) to fp32 out (N, K),
// each weight as gguf's reference dequantization gives it.
void dequantize_raw(const uint8_t* src, int64_t N, int64_t qtype, int64_t K, float* out) {
  const int64_t bb = block_bytes(qtype), bw = block_weights(qtype), nb = K / bw;
  with_qtype(qtype, [&](auto t) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t b = 0; b < nb; ++b)
        dequantize_block<decltype(t)::value>(src + (n * nb + b) * bb, out + n * K + b * bw);
  });
}

// Rows ``index`` (R of them, each in [0, N)) of a packed matrix (``pack_raw`` of N rows of K
// weights) as fp32 out (R, K), each weight as gguf's reference dequantization gives it; rows
// split over the calling thread's pool.
void unpack_rows_raw(const uint8_t* packed, int64_t qtype, int64_t K, const int64_t* index,
                     int64_t R, float* out) {
  const int64_t bb = block_bytes(qtype), bw = block_weights(qtype), nb = K / bw;
  with_qtype(qtype, [&](auto t) {
    parallel_for(R, 16, [&](int64_t r0, int64_t r1) {
      uint8_t block[MAX_BLOCK_BYTES];
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = index[r];
        const uint8_t* grp = packed + (n / GROUP) * nb * GROUP * bb;
        for (int64_t b = 0; b < nb; ++b) {
          unpack_block(grp + b * GROUP * bb, t.value, n % GROUP, block);
          dequantize_block<decltype(t)::value>(block, out + r * K + b * bw);
        }
      }
    });
  });
}

// The vector path this build compiled: "avx512", "avx2", "neon" or "portable" (scalar only).
const char* simd_path() {
#if TB_HAVE_NEON
  return "neon";
#elif TB_HAVE_AVX512
  return "avx512";
#elif TB_HAVE_AVX2
  return "avx2";
#else
  return "portable";
#endif
}

// out = weight * (x * rsqrt(mean(x^2) + eps)), transformers' LlamaRMSNorm in fp32.
void rms_norm(const float* x, const float* weight, double eps, int64_t n, float* out) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(n) + static_cast<float>(eps));
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * scale);
}

// In place: v = v * cos + rotate_half(v) * sin over one head of ``dim`` values.
void rope(float* v, const float* cos, const float* sin, int64_t dim) {
  const int64_t half = dim / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float a = v[j], b = v[j + half];
    v[j] = a * cos[j] - b * sin[j];
    v[j + half] = b * cos[j + half] + a * sin[j + half];
  }
}

// Attention of one decoding step, split as flash-decoding does: a task is one row's KV head
// over one chunk of its cached tokens, for all the query heads of that head's group (each key
// and value is read once for the group). Tasks keep an unnormalised output with its running
// maximum and sum; merge_attention combines the chunks (exp(max_c - max) rescaling).
struct AttentionTask {
  int64_t row, kv_head, begin, end;
};

constexpr int64_t ATTENTION_CHUNK = 512;  // cached tokens a task (two tasks a head from 1k)

std::vector<AttentionTask> attention_tasks(const std::vector<int64_t>& n_live,
                                           int64_t n_kv_heads) {
  std::vector<AttentionTask> tasks;
  for (int64_t r = 0; r < static_cast<int64_t>(n_live.size()); ++r)
    for (int64_t h = 0; h < n_kv_heads; ++h)
      for (int64_t b = 0; b < n_live[r]; b += ATTENTION_CHUNK)
        tasks.push_back({r, h, b, std::min(n_live[r], b + ATTENTION_CHUNK)});
  return tasks;
}

// W floats of one vector and the operations the attention and the activations need: AVX2
// (W = 8; an AVX-512 build keeps these 8-wide) or NEON (W = 4). The functions below are
// written once over them, so the two paths do the same operations in the same order within
// a vector (exp_vec gives the same bits on both).
#if TB_HAVE_AVX2
struct VF {
  using F = __m256;
  static constexpr int64_t W = 8;
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F zero() { return _mm256_setzero_ps(); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }    // a b + c, one rounding
  static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a b, one rounding
  static F floor(F a) { return _mm256_floor_ps(a); }
  static F pow2(F n) {  // 2^n for integral n in [-126, 127]: the exponent field
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static float hsum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static F sums(const F a[W]) {  // lane i: the sum of a[i]'s lanes
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
  }
};
#elif TB_HAVE_NEON
struct VF {
  using F = float32x4_t;
  static constexpr int64_t W = 4;
  static F load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, F v) { vst1q_f32(p, v); }
  static F set1(float v) { return vdupq_n_f32(v); }
  static F zero() { return vdupq_n_f32(0.0f); }
  static F add(F a, F b) { return vaddq_f32(a, b); }
  static F sub(F a, F b) { return vsubq_f32(a, b); }
  static F mul(F a, F b) { return vmulq_f32(a, b); }
  static F div(F a, F b) { return vdivq_f32(a, b); }
  static F min(F a, F b) { return vminq_f32(a, b); }
  static F max(F a, F b) { return vmaxq_f32(a, b); }
  static F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  static F fnma(F a, F b, F c) { return vfmsq_f32(c, a, b); }
  static F floor(F a) { return vrndmq_f32(a); }
  static F pow2(F n) {
    return vreinterpretq_f32_s32(
        vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
  }
  static float hsum(F v) { return vaddvq_f32(v); }
  static F sums(const F a[W]) {
    return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3]));
  }
};
#endif
#define TB_HAVE_VF (TB_HAVE_AVX2 || TB_HAVE_NEON)

#if TB_HAVE_VF
// e^x for W floats: Cody-Waite reduction x = n ln2 + r and Cephes' degree-6 polynomial for e^r
// (about 1 ulp, as torch's own vectorised exp; inputs clamped to [-87.3, 88.4]). Written here
// because the softmax and SiLU of a step call exp ~10^5-10^6 times and the scalar std::exp
// took several ms of a 3000-token step; no vector exp ships with the compiler for this use.
inline VF::F exp_vec(VF::F x) {
  x = VF::min(VF::max(x, VF::set1(-87.3365448f)), VF::set1(88.3762626f));
  const VF::F n = VF::floor(VF::fma(x, VF::set1(1.44269504088896341f), VF::set1(0.5f)));
  x = VF::fnma(n, VF::set1(0.693359375f), x);
  x = VF::fnma(n, VF::set1(-2.12194440e-4f), x);
  VF::F y = VF::set1(1.9875691500e-4f);
  y = VF::fma(y, x, VF::set1(1.3981999507e-3f));
  y = VF::fma(y, x, VF::set1(8.3334519073e-3f));
  y = VF::fma(y, x, VF::set1(4.1665795894e-2f));
  y = VF::fma(y, x, VF::set1(1.6666665459e-1f));
  y = VF::fma(y, x, VF::set1(5.0000001201e-1f));
  y = VF::fma(y, VF::mul(x, x), VF::add(x, VF::set1(1.0f)));
  return VF::mul(y, VF::pow2(n));
}

// scores[j] = scale * q . k_j for keys [0, n) of ``kh`` (n, dim), dim a multiple of W: W keys
// at a time, their W dot products reduced together.
void scores_vec(const float* q, const float* kh, int64_t n, int64_t dim, float scale,
                float* scores) {
  constexpr int64_t W = VF::W;
  const VF::F sv = VF::set1(scale);
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    VF::F acc[W];
    for (int64_t t = 0; t < W; ++t) acc[t] = VF::zero();
    for (int64_t d = 0; d < dim; d += W) {
      const VF::F qv = VF::load(q + d);
      for (int64_t t = 0; t < W; ++t) acc[t] = VF::fma(qv, VF::load(kh + (j + t) * dim + d), acc[t]);
    }
    VF::store(scores + j, VF::mul(VF::sums(acc), sv));
  }
  for (; j < n; ++j) {
    VF::F acc = VF::zero();
    for (int64_t d = 0; d < dim; d += W)
      acc = VF::fma(VF::load(q + d), VF::load(kh + j * dim + d), acc);
    scores[j] = VF::hsum(acc) * scale;
  }
}

// scores[j] = exp(scores[j] - best) in place for j < n; returns their sum.
float softmax_weights_vec(float* scores, int64_t n, float best) {
  constexpr int64_t W = VF::W;
  const VF::F bv = VF::set1(best);
  VF::F total = VF::zero();
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const VF::F e = exp_vec(VF::sub(VF::load(scores + j), bv));
    VF::store(scores + j, e);
    total = VF::add(total, e);
  }
  float sum = VF::hsum(total);
  if (j < n) {  // the last < W through the same exp, lanes past n unused
    float lanes[W];
    for (int64_t t = 0; t < W; ++t) lanes[t] = j + t < n ? scores[j + t] - best : 0.0f;
    VF::store(lanes, exp_vec(VF::load(lanes)));
    for (; j < n; ++j) sum += scores[j] = lanes[j % W];
  }
  return sum;
}

// out[g] += sum_j p[g][j] v_j over keys [0, n) of ``vh`` (n, dim), for G query heads, dim a
// multiple of 2 W: 2 W values of out per pass, held in registers for all keys (G a template
// argument, so the accumulators stay in registers).
constexpr int64_t MAX_GROUP = 4;

template <int64_t G>
void weighted_values_g(const float* p, int64_t p_stride, const float* vh, int64_t n,
                       int64_t dim, float* out) {
  constexpr int64_t W = VF::W;
  for (int64_t d = 0; d < dim; d += 2 * W) {
    VF::F acc[G][2];
    for (int64_t g = 0; g < G; ++g) acc[g][0] = acc[g][1] = VF::zero();
    for (int64_t j = 0; j < n; ++j) {
      const VF::F v0 = VF::load(vh + j * dim + d);
      const VF::F v1 = VF::load(vh + j * dim + d + W);
      for (int64_t g = 0; g < G; ++g) {
        const VF::F pg = VF::set1(p[g * p_stride + j]);
        acc[g][0] = VF::fma(pg, v0, acc[g][0]);
        acc[g][1] = VF::fma(pg, v1, acc[g][1]);
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      float* og = out + g * dim + d;
      VF::store(og, VF::add(VF::load(og), acc[g][0]));
      VF::store(og + W, VF::add(VF::load(og + W), acc[g][1]));
    }
  }
}

// Any group size: MAX_GROUP query heads a pass over the tile's values (Qwen2.5 1.5B has 6 a
// KV head, 0.5B 7; the tile's values stay in L1 / L2 between the passes).
void weighted_values_vec(const float* p, int64_t p_stride, const float* vh, int64_t n,
                         int64_t group, int64_t dim, float* out) {
  for (int64_t g0 = 0; g0 < group; g0 += MAX_GROUP) {
    const float* pg = p + g0 * p_stride;
    float* og = out + g0 * dim;
    switch (std::min(group - g0, MAX_GROUP)) {
      case 1: weighted_values_g<1>(pg, p_stride, vh, n, dim, og); break;
      case 2: weighted_values_g<2>(pg, p_stride, vh, n, dim, og); break;
      case 3: weighted_values_g<3>(pg, p_stride, vh, n, dim, og); break;
      default: weighted_values_g<4>(pg, p_stride, vh, n, dim, og); break;
    }
  }
}
#endif

constexpr int64_t ATTENTION_TILE = 64;  // keys a pass (their K or V rows stay in L1)

// Ask for the ``n`` floats at ``p`` ahead of use (the next tile's keys or values): a step's KV
// is mostly not in cache, and a head's short stream gives the hardware prefetcher little time.
inline void prefetch(const float* p, int64_t n) {
  prefetch_bytes<2>(p, n * static_cast<int64_t>(sizeof(float)));
}

// One task: ``q`` (group, dim) query heads, ``kh`` / ``vh`` (capacity, dim) of one KV head;
// writes out (group, dim) unnormalised, best (group,) maxima and total (group,) sums. Keys are
// taken in tiles of ATTENTION_TILE, all the group's query heads per tile.
void attend_chunk(const float* q, const float* kh, const float* vh, int64_t begin, int64_t end,
                  int64_t group, int64_t dim, float scale, float* out, float* best,
                  float* total) {
  const int64_t n = end - begin;
  float* scores = scratch(SCORES, group * n);
#if TB_HAVE_VF
  const bool vector = dim % VF::W == 0;
  const bool vector_values = dim % (2 * VF::W) == 0;
#else
  const bool vector = false, vector_values = false;
#endif
  for (int64_t t = 0; t < n; t += ATTENTION_TILE) {
    const int64_t tile = std::min(ATTENTION_TILE, n - t);
    if (t + tile < n)
      prefetch(kh + (begin + t + tile) * dim, std::min(ATTENTION_TILE, n - t - tile) * dim);
    for (int64_t g = 0; g < group; ++g) {
      float* sg = scores + g * n + t;
#if TB_HAVE_VF
      if (vector) scores_vec(q + g * dim, kh + (begin + t) * dim, tile, dim, scale, sg);
#endif
      if (!vector) {
        for (int64_t j = 0; j < tile; ++j) {
          const float* kj = kh + (begin + t + j) * dim;
          const float* qg = q + g * dim;
          float s = 0.0f;
          // A dot product over the head dimension; the pragma lets the compiler vectorise
          // the sum (a reassociation, as any vectorised GEMM does).
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < dim; ++d) s += qg[d] * kj[d];
          sg[j] = s * scale;
        }
      }
    }
  }
  prefetch(vh + begin * dim, std::min(ATTENTION_TILE, n) * dim);
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores + g * n;
    best[g] = -INFINITY;
    for (int64_t j = 0; j < n; ++j) best[g] = std::max(best[g], sg[j]);
#if TB_HAVE_VF
    if (vector) total[g] = softmax_weights_vec(sg, n, best[g]);
#endif
    if (!vector) {
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        sg[j] = std::exp(sg[j] - best[g]);
        sum += sg[j];
      }
      total[g] = sum;
    }
    for (int64_t d = 0; d < dim; ++d) out[g * dim + d] = 0.0f;
  }
  for (int64_t t = 0; t < n; t += ATTENTION_TILE) {
    const int64_t tile = std::min(ATTENTION_TILE, n - t);
    if (t + tile < n)
      prefetch(vh + (begin + t + tile) * dim, std::min(ATTENTION_TILE, n - t - tile) * dim);
#if TB_HAVE_VF
    if (vector_values) {
      weighted_values_vec(scores + t, n, vh + (begin + t) * dim, tile, group, dim, out);
      continue;
    }
#endif
    for (int64_t j = t; j < t + tile; ++j) {
      const float* vj = vh + (begin + j) * dim;
      for (int64_t g = 0; g < group; ++g) {
        const float p = scores[g * n + j];
        float* og = out + g * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) og[d] += p * vj[d];
      }
    }
  }
  (void)vector_values;
}

// softmax(q K^T * scale) V for every row and query head: q (M, n_heads * dim) -> attn (same).
// keys[r] / values[r] (1, H_kv, C_r, D) hold row r's n_live[r] tokens.
void attention(const float* q, const std::vector<float*>& keys,
               const std::vector<float*>& values, const std::vector<int64_t>& capacity,
               const std::vector<int64_t>& n_live, int64_t n_heads, int64_t n_kv_heads,
               int64_t dim, float scale, float* attn) {
  const int64_t group = n_heads / n_kv_heads, q_rows = n_heads * dim;
  const auto tasks = attention_tasks(n_live, n_kv_heads);
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  float* outs = scratch(OUTS, n_tasks * group * dim);
  float* bests = scratch(BESTS, n_tasks * group);
  float* totals = scratch(TOTALS, n_tasks * group);
  // The first tile of a task's keys and values, asked for ahead (a task's own at the start of
  // a chunk of tasks, then the next task's while one runs): many misses in flight at once
  // instead of one tile's demand misses after another.
  auto prefetch_task = [&](int64_t t) {
    const AttentionTask& task = tasks[t];
    const int64_t offset = (task.kv_head * capacity[task.row] + task.begin) * dim;
    const int64_t n = std::min(ATTENTION_TILE, task.end - task.begin) * dim;
    prefetch(keys[task.row] + offset, n);
    prefetch(values[task.row] + offset, n);
  };
  parallel_for(n_tasks, 1, [&](int64_t t0, int64_t t1) {
    prefetch_task(t0);
    for (int64_t t = t0; t < t1; ++t) {
      if (t + 1 < t1) prefetch_task(t + 1);
      const AttentionTask& task = tasks[t];
      const int64_t offset = task.kv_head * capacity[task.row] * dim;
      attend_chunk(q + task.row * q_rows + task.kv_head * group * dim,
                   keys[task.row] + offset, values[task.row] + offset, task.begin, task.end,
                   group, dim, scale, outs + t * group * dim,
                   bests + t * group, totals + t * group);
    }
  });
  // Merge the chunks of each (row, KV head): tasks of one pair are consecutive.
  for (int64_t t = 0; t < n_tasks;) {
    int64_t last = t;
    while (last + 1 < n_tasks && tasks[last + 1].row == tasks[t].row &&
           tasks[last + 1].kv_head == tasks[t].kv_head)
      ++last;
    for (int64_t g = 0; g < group; ++g) {
      float best = -INFINITY;
      for (int64_t c = t; c <= last; ++c) best = std::max(best, bests[c * group + g]);
      float* o = attn + tasks[t].row * q_rows + (tasks[t].kv_head * group + g) * dim;
      float total = 0.0f;
      for (int64_t d = 0; d < dim; ++d) o[d] = 0.0f;
      for (int64_t c = t; c <= last; ++c) {
        const float w = std::exp(bests[c * group + g] - best);
        total += w * totals[c * group + g];
        const float* oc = outs + (c * group + g) * dim;
        for (int64_t d = 0; d < dim; ++d) o[d] += w * oc[d];
      }
      for (int64_t d = 0; d < dim; ++d) o[d] /= total;
    }
    t = last + 1;
  }
}

// out[i] = silu(gate[i]) * gate[n + i] for i < n (SwiGLU; gate holds gate then up, (2 n,)).
void silu_times(const float* gate, int64_t n, float* out) {
  int64_t i = 0;
#if TB_HAVE_VF
  const VF::F one = VF::set1(1.0f);
  for (; i + VF::W <= n; i += VF::W) {
    const VF::F g = VF::load(gate + i);
    const VF::F e = exp_vec(VF::sub(VF::zero(), g));
    VF::store(out + i, VF::mul(VF::div(g, VF::add(one, e)), VF::load(gate + n + i)));
  }
#endif
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * gate[n + i];
}

// out[i] = gelu_tanh(gate[i]) * gate[n + i] for i < n (GeGLU, torch's tanh approximation).
void gelu_tanh_times(const float* gate, int64_t n, float* out) {
  constexpr float k0 = 0.7978845608028654f, k1 = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(k0 * (g + k1 * g * g * g))) * gate[n + i];
  }
}

}  // namespace
