// y = x W^T with W kept as a GGUF file's own blocks (Q4_0, Q4_1, Q8_0) or its K-quants
// (Q4_K, Q5_K, Q6_K) repacked at load into 32-weight blocks of fp32 scale / min and 4- or 8-bit
// codes (engine/kquants.py; formats at QType below), x fp32.
//
// Why by hand (docs/engine.md, PLATFORM.md): no maintained library multiplies fp32 activations
// by these blocks on an AVX2 CPU without quantizing the activations. llama.cpp quantizes x to
// 8 bits (its answers drift from fp32's); torch's int4/int8 packed GEMMs vectorise only bf16
// activations on x86; onnxruntime's MatMulNBits takes a slow path for Q4_1's float minimum.
// The portable path dequantizes each weight exactly as gguf's reference does (w = d * q + m in
// fp32: d * q is exact, one rounding for + m) and multiplies; the AVX2 path regroups the same
// sum per block as d * sum(q x) + m * sum(x) (fewer operations a weight). Both compute the
// products of the dequantized fp32 weights the engine runs today; only the rounding of the
// summation differs, as between any two GEMM libraries.
//
// Shapes: x (M, K) fp32 contiguous, M <= MAX_ROWS (a decoding step of M goals); w (N,
// row_bytes) uint8, each row ceil(K / 32) blocks; y (M, N) fp32. Every block is decoded once
// and used for all M rows. Rows of W are split over torch's intra-op threads. The repacked
// K-quants need K to be a multiple of 256 (the super-blocks they come from).
//
// Two paths: AVX2 + FMA + F16C (compiled where the build machine has them: the library is
// built with -march=native for the machine that runs it), and a portable scalar path (ARM,
// older x86) that the tests check against the same dequantized weights.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define TB_HAVE_AVX2 1
#else
#define TB_HAVE_AVX2 0
#endif

namespace {

constexpr int64_t QK = 32;        // weights per block
constexpr int64_t QK_K = 256;     // weights per K-quant super-block
constexpr int64_t MAX_ROWS = 8;   // activation rows per call
constexpr int64_t MAX_BLOCKS = 1024;  // blocks per weight row (K <= 32768)
// GGML type ids of the file's own blocks (Q4_0, Q4_1, Q8_0), and the internal formats that
// engine/kquants.py repacks the K-quants into at load: 100 + the K-quant's GGML id (GGML's own
// ids stay below 100). An internal block holds 32 weights, two fp32 parameters first:
//   Q4_K_R (112): scale, min, 16 bytes of 4-bit codes 0..15 in Q4_1's order (byte j holds
//                 weight j in its low nibble, weight j + 16 in its high one): 24 bytes
//   Q5_K_R (113): scale, min, 32 int8 codes 0..31: 40 bytes
//   Q6_K_R (114): scale of weights 0-15, scale of weights 16-31, 32 int8 codes -32..31: 40 bytes
// w = scale * code + min (Q6_K_R: scale * code). scale and min are gguf's own fp32 d * sc and
// -(dmin * m); scale * code is exact in fp32, so the one rounding left is gguf's.
enum QType : int64_t { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K_R = 112, Q5_K_R = 113, Q6_K_R = 114 };
constexpr const char* TYPES_HELP =
    " (Q4_0 = 2, Q4_1 = 3, Q8_0 = 8; the K-quants Q4_K / Q5_K / Q6_K are read repacked, "
    "as 112 / 113 / 114: engine/kquants.py)";

int64_t block_bytes(int64_t qtype) {
  switch (qtype) {
    case Q4_0: return 2 + QK / 2;
    case Q4_1: return 4 + QK / 2;
    case Q8_0: return 2 + QK;
    case Q4_K_R: return 8 + QK / 2;
    case Q5_K_R: return 8 + QK;
    case Q6_K_R: return 8 + QK;
    default: return -1;
  }
}

inline bool is_kquant(int64_t qtype) {
  return qtype == Q4_K_R || qtype == Q5_K_R || qtype == Q6_K_R;
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
    case Q8_0: return f(QT<Q8_0>{});
    case Q4_K_R: return f(QT<Q4_K_R>{});
    case Q5_K_R: return f(QT<Q5_K_R>{});
    case Q6_K_R: return f(QT<Q6_K_R>{});
    default: TORCH_CHECK(false, "unsupported GGML type ", qtype, TYPES_HELP);
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

inline float read_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Dequantize one block to w[32] exactly as gguf's reference dequantization does.
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
  } else if constexpr (T == Q4_K_R) {  // gguf: (d * sc) * q - dmin * m, the product exact
    const float s = read_f32(b), m = read_f32(b + 4);
    const uint8_t* qs = b + 8;
    for (int j = 0; j < QK / 2; ++j) {
      w[j] = std::fma(s, static_cast<float>(qs[j] & 0x0f), m);
      w[j + QK / 2] = std::fma(s, static_cast<float>(qs[j] >> 4), m);
    }
  } else if constexpr (T == Q5_K_R) {
    const float s = read_f32(b), m = read_f32(b + 4);
    const int8_t* q = reinterpret_cast<const int8_t*>(b + 8);
    for (int j = 0; j < QK; ++j) w[j] = std::fma(s, static_cast<float>(q[j]), m);
  } else {  // Q6_K_R: gguf: (d * sc) * q, one scale per 16 weights
    static_assert(T == Q6_K_R, "a type without a dequantization");
    const float s0 = read_f32(b), s1 = read_f32(b + 4);
    const int8_t* q = reinterpret_cast<const int8_t*>(b + 8);
    for (int j = 0; j < QK / 2; ++j) w[j] = s0 * static_cast<float>(q[j]);
    for (int j = QK / 2; j < QK; ++j) w[j] = s1 * static_cast<float>(q[j]);
  }
}

// Portable path: rows [n0, n1) of y.
template <int64_t T>
void rows_portable_t(const uint8_t* w, int64_t row_bytes, const float* x, int64_t M, int64_t K,
                     float* y, int64_t N, int64_t n0, int64_t n1) {
  const int64_t nb = K / QK, bb = block_bytes(T);
  float wb[QK];
  for (int64_t n = n0; n < n1; ++n) {
    float acc[MAX_ROWS] = {0};
    const uint8_t* row = w + n * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      dequantize_block<T>(row + b * bb, wb);
      for (int64_t r = 0; r < M; ++r) {
        const float* xr = x + r * K + b * QK;
        float s = 0.0f;
        for (int j = 0; j < QK; ++j) s = std::fma(wb[j], xr[j], s);
        acc[r] += s;
      }
    }
    for (int64_t r = 0; r < M; ++r) y[r * N + n] = acc[r];
  }
}

void rows_portable(int64_t qtype, const uint8_t* w, int64_t row_bytes, const float* x,
                   int64_t M, int64_t K, float* y, int64_t N, int64_t n0, int64_t n1) {
  with_qtype(qtype, [&](auto t) {
    rows_portable_t<decltype(t)::value>(w, row_bytes, x, M, K, y, N, n0, n1);
  });
}

#if TB_HAVE_AVX2
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The 32 codes of one repacked K-quant block (``c``: its codes) as four vectors of 8 floats
// (elements 0-7, 8-15, 16-23, 24-31): 0..15 (Q4_K_R), 0..31 (Q5_K_R), -32..31 (Q6_K_R).
template <int64_t T>
inline void kquant_codes_avx2(const uint8_t* c, __m256 q[4]) {
  if constexpr (T == Q4_K_R) {
    const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)));
    const __m256i v1 =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + 8)));
    const __m256i mask = _mm256_set1_epi32(0x0f);
    q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(v0, mask));
    q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(v1, mask));
    q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4));
    q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4));
  } else {
    for (int i = 0; i < 4; ++i) {
      __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + 8 * i));
      q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    }
  }
}

// Repacked K-quants: sum over one block of w_j x_j = sum((s q_j) x_j) + min * sum(x_j). s q_j
// is exact in fp32 (the weight before its minimum), so it is formed once a block and shared by
// all rows: four FMAs a row and block. Q6_K_R scales weights 0-15 and 16-31 apart and has no
// minimum. ``xs`` (ROWS, nb) holds each activation row's block sums; with few rows, P
// accumulators a row hide the FMA latency. The same products as the dequantized weights',
// regrouped (rounding differs, as any summation order's).
template <int64_t T, int64_t ROWS>
void rows_avx2_kquant_fixed(const uint8_t* w, int64_t row_bytes, const float* x,
                            const float* xs, int64_t K, float* y, int64_t N, int64_t n0,
                            int64_t n1) {
  constexpr int P = ROWS == 1 ? 4 : (ROWS <= 3 ? 2 : 1);
  constexpr bool has_min = T != Q6_K_R;
  const int64_t nb = K / QK, bb = block_bytes(T);
  for (int64_t n = n0; n < n1; ++n) {
    __m256 acc[ROWS][P];
    float macc[ROWS];
    for (int64_t r = 0; r < ROWS; ++r) {
      for (int a = 0; a < P; ++a) acc[r][a] = _mm256_setzero_ps();
      macc[r] = 0.0f;
    }
    const uint8_t* row = w + n * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = row + b * bb;
      __m256 q[4];
      kquant_codes_avx2<T>(blk + 8, q);
      const __m256 s0 = _mm256_set1_ps(read_f32(blk));
      const __m256 s1 = T == Q6_K_R ? _mm256_set1_ps(read_f32(blk + 4)) : s0;
      const float m = has_min ? read_f32(blk + 4) : 0.0f;
      q[0] = _mm256_mul_ps(s0, q[0]);
      q[1] = _mm256_mul_ps(s0, q[1]);
      q[2] = _mm256_mul_ps(s1, q[2]);
      q[3] = _mm256_mul_ps(s1, q[3]);
      for (int64_t r = 0; r < ROWS; ++r) {
        const float* xr = x + r * K + b * QK;
        for (int i = 0; i < 4; ++i)
          acc[r][i % P] = _mm256_fmadd_ps(q[i], _mm256_loadu_ps(xr + 8 * i), acc[r][i % P]);
        if constexpr (has_min) macc[r] = std::fma(m, xs[r * nb + b], macc[r]);
      }
    }
    for (int64_t r = 0; r < ROWS; ++r) {
      __m256 sum = acc[r][0];
      for (int a = 1; a < P; ++a) sum = _mm256_add_ps(sum, acc[r][a]);
      y[r * N + n] = has_min ? hsum(sum) + macc[r] : hsum(sum);
    }
  }
}

template <int64_t T>
void rows_avx2_kquant_t(const uint8_t* w, int64_t row_bytes, const float* x, const float* xs,
                        int64_t M, int64_t K, float* y, int64_t N, int64_t n0, int64_t n1) {
  switch (M) {
    case 1: return rows_avx2_kquant_fixed<T, 1>(w, row_bytes, x, xs, K, y, N, n0, n1);
    case 2: return rows_avx2_kquant_fixed<T, 2>(w, row_bytes, x, xs, K, y, N, n0, n1);
    case 3: return rows_avx2_kquant_fixed<T, 3>(w, row_bytes, x, xs, K, y, N, n0, n1);
    case 4: return rows_avx2_kquant_fixed<T, 4>(w, row_bytes, x, xs, K, y, N, n0, n1);
    case 5: return rows_avx2_kquant_fixed<T, 5>(w, row_bytes, x, xs, K, y, N, n0, n1);
    case 6: return rows_avx2_kquant_fixed<T, 6>(w, row_bytes, x, xs, K, y, N, n0, n1);
    case 7: return rows_avx2_kquant_fixed<T, 7>(w, row_bytes, x, xs, K, y, N, n0, n1);
    default: return rows_avx2_kquant_fixed<T, 8>(w, row_bytes, x, xs, K, y, N, n0, n1);
  }
}

// The repacked K-quants' AVX2 rows; the GGML types' are rows_avx2_fixed's.
void rows_avx2_kquant(int64_t qtype, const uint8_t* w, int64_t row_bytes, const float* x,
                      const float* xs, int64_t M, int64_t K, float* y, int64_t N, int64_t n0,
                      int64_t n1) {
  if (qtype == Q4_K_R) return rows_avx2_kquant_t<Q4_K_R>(w, row_bytes, x, xs, M, K, y, N, n0, n1);
  if (qtype == Q5_K_R) return rows_avx2_kquant_t<Q5_K_R>(w, row_bytes, x, xs, M, K, y, N, n0, n1);
  rows_avx2_kquant_t<Q6_K_R>(w, row_bytes, x, xs, M, K, y, N, n0, n1);
}

// The 32 codes of one block as four vectors of 8 floats (elements 0-7, 8-15, 16-23, 24-31):
// 0..15 for Q4_0 / Q4_1, -128..127 for Q8_0. Two byte-to-int widenings per block (the shuffle
// port is the scarce one); the nibbles are split with and / shift on the other ports.
inline void codes_avx2(int64_t qtype, const uint8_t* b, __m256 q[4]) {
  if (qtype == Q8_0) {
    const uint8_t* c = b + 2;
    for (int i = 0; i < 4; ++i) {
      __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + 8 * i));
      q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    }
    return;
  }
  const uint8_t* qs = b + (qtype == Q4_1 ? 4 : 2);
  const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
  const __m256i v1 =
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
  const __m256i mask = _mm256_set1_epi32(0x0f);
  q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(v0, mask));
  q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(v1, mask));
  q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4));
  q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4));
}

// Sum over one block of w_j x_j = d * sum(q_j x_j) + c * sum(x_j), c = m (Q4_1), -8 d (Q4_0),
// 0 (Q8_0): the same products regrouped (rounding differs, as any summation order's).
// ``xs`` (ROWS, nb) holds each activation row's block sums. Two accumulator sets per row hide
// the FMA latency when few rows give little independent work.
template <int64_t ROWS>
void rows_avx2_fixed(int64_t qtype, const uint8_t* w, int64_t row_bytes, const float* x,
                     const float* xs, int64_t K, float* y, int64_t N, int64_t n0, int64_t n1) {
  constexpr int A = ROWS <= 2 ? 2 : 1;
  const int64_t nb = K / QK, bb = block_bytes(qtype);
  const bool q4_1 = qtype == Q4_1, q4_0 = qtype == Q4_0;
  for (int64_t n = n0; n < n1; ++n) {
    __m256 acc[ROWS][A];
    float macc[ROWS][A];
    for (int64_t r = 0; r < ROWS; ++r)
      for (int a = 0; a < A; ++a) {
        acc[r][a] = _mm256_setzero_ps();
        macc[r][a] = 0.0f;
      }
    const uint8_t* row = w + n * row_bytes;
    for (int64_t b0 = 0; b0 < nb; b0 += A) {
      for (int a = 0; a < A && b0 + a < nb; ++a) {
        const int64_t b = b0 + a;
        const uint8_t* blk = row + b * bb;
        __m256 q[4];
        codes_avx2(qtype, blk, q);
        const float d = _cvtsh_ss(read_u16(blk));
        const float c = q4_1 ? _cvtsh_ss(read_u16(blk + 2)) : (q4_0 ? -8.0f * d : 0.0f);
        const __m256 dv = _mm256_set1_ps(d);
        for (int64_t r = 0; r < ROWS; ++r) {
          const float* xr = x + r * K + b * QK;
          __m256 t0 = _mm256_mul_ps(q[0], _mm256_loadu_ps(xr));
          __m256 t1 = _mm256_mul_ps(q[2], _mm256_loadu_ps(xr + 16));
          t0 = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xr + 8), t0);
          t1 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xr + 24), t1);
          acc[r][a] = _mm256_fmadd_ps(dv, _mm256_add_ps(t0, t1), acc[r][a]);
          macc[r][a] = std::fma(c, xs[r * nb + b], macc[r][a]);
        }
      }
    }
    for (int64_t r = 0; r < ROWS; ++r) {
      __m256 sum = acc[r][0];
      float msum = macc[r][0];
      for (int a = 1; a < A; ++a) {
        sum = _mm256_add_ps(sum, acc[r][a]);
        msum += macc[r][a];
      }
      y[r * N + n] = hsum(sum) + msum;
    }
  }
}

void rows_avx2(int64_t qtype, const uint8_t* w, int64_t row_bytes, const float* x,
               const float* xs, int64_t M, int64_t K, float* y, int64_t N, int64_t n0,
               int64_t n1) {
  if (is_kquant(qtype)) return rows_avx2_kquant(qtype, w, row_bytes, x, xs, M, K, y, N, n0, n1);
  switch (M) {
    case 1: return rows_avx2_fixed<1>(qtype, w, row_bytes, x, xs, K, y, N, n0, n1);
    case 2: return rows_avx2_fixed<2>(qtype, w, row_bytes, x, xs, K, y, N, n0, n1);
    case 3: return rows_avx2_fixed<3>(qtype, w, row_bytes, x, xs, K, y, N, n0, n1);
    case 4: return rows_avx2_fixed<4>(qtype, w, row_bytes, x, xs, K, y, N, n0, n1);
    case 5: return rows_avx2_fixed<5>(qtype, w, row_bytes, x, xs, K, y, N, n0, n1);
    case 6: return rows_avx2_fixed<6>(qtype, w, row_bytes, x, xs, K, y, N, n0, n1);
    case 7: return rows_avx2_fixed<7>(qtype, w, row_bytes, x, xs, K, y, N, n0, n1);
    default: return rows_avx2_fixed<8>(qtype, w, row_bytes, x, xs, K, y, N, n0, n1);
  }
}
#endif

}  // namespace

// y (M, N) = x (M, K) W^T over raw pointers; rows of W split over torch's OpenMP threads.
void gemm_raw(int64_t qtype, const uint8_t* w, int64_t row_bytes, const float* xp, int64_t M,
              int64_t K, float* yp, int64_t N, bool portable) {
  const bool use_avx2 = TB_HAVE_AVX2 && !portable;
  // Block sums of each activation row (M, K / 32), for the AVX2 path's scale-and-minimum
  // regrouping (the portable path does not read them).
  float xs[MAX_ROWS * MAX_BLOCKS];
  if (use_avx2) {
    for (int64_t r = 0; r < M; ++r)
      for (int64_t b = 0; b < K / QK; ++b) {
        float s = 0.0f;
        for (int j = 0; j < QK; ++j) s += xp[r * K + b * QK + j];
        xs[r * (K / QK) + b] = s;
      }
  }
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
#if TB_HAVE_AVX2
    if (use_avx2) {
      rows_avx2(qtype, w, row_bytes, xp, xs, M, K, yp, N, n0, n1);
      return;
    }
#endif
    rows_portable(qtype, w, row_bytes, xp, M, K, yp, N, n0, n1);
  });
  (void)use_avx2;
  (void)xs;
}

void check_blocks(const torch::Tensor& blocks, int64_t qtype, int64_t K, const char* what) {
  const int64_t bb = block_bytes(qtype);
  TORCH_CHECK(bb > 0, "unsupported GGML type ", qtype, TYPES_HELP);
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == torch::kUInt8 &&
              blocks.is_contiguous(), what, " must be a contiguous (N, row_bytes) uint8 tensor");
  TORCH_CHECK(K % QK == 0, "K must be a multiple of 32, got ", K);
  TORCH_CHECK(!is_kquant(qtype) || K % QK_K == 0, "K must be a multiple of ", QK_K,
              " (a K-quant super-block) for type ", qtype, ", got ", K);
  TORCH_CHECK(K / QK <= MAX_BLOCKS, "K must be at most ", MAX_BLOCKS * QK, ", got ", K);
  TORCH_CHECK(blocks.size(1) == K / QK * bb, "rows of ", blocks.size(1), " bytes do not hold ",
              K, " weights of type ", qtype);
}

// y (M, N) = x (M, K) W^T; W = ``blocks`` (N, row_bytes) of GGML type ``qtype``.
// ``portable`` forces the scalar path (tests compare both).
torch::Tensor gemm(torch::Tensor x, torch::Tensor blocks, int64_t qtype, bool portable) {
  TORCH_CHECK(block_bytes(qtype) > 0, "unsupported GGML type ", qtype, TYPES_HELP);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "x must be a contiguous (M, K) float32 tensor");
  const int64_t M = x.size(0), K = x.size(1), N = blocks.size(0);
  TORCH_CHECK(M >= 1 && M <= MAX_ROWS, "x must have 1 to ", MAX_ROWS, " rows, got ", M);
  check_blocks(blocks, qtype, K, "blocks");
  auto y = torch::empty({M, N}, x.options());
  gemm_raw(qtype, blocks.data_ptr<uint8_t>(), blocks.size(1), x.data_ptr<float>(), M, K,
           y.data_ptr<float>(), N, portable);
  return y;
}

namespace {

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

}  // namespace

// One decoder layer of a one-token step, every linear on GGUF blocks (Llama family, fp32):
// x (hidden,) -> x + attn(...) -> + mlp(...); writes the token's key and value at position
// ``n_kv`` of ``keys`` / ``values`` (1, H_kv, C, D), whose capacity the caller ensured. One
// call instead of ~25 torch ops dispatched from Python; the caller still checks its interrupt
// before every layer.
torch::Tensor layer_step(torch::Tensor x, torch::Tensor in_norm, double in_eps,
                         torch::Tensor qkv, int64_t qkv_type, torch::Tensor out_proj,
                         int64_t out_type, torch::Tensor post_norm, double post_eps,
                         torch::Tensor gate_up, int64_t gate_up_type, torch::Tensor down,
                         int64_t down_type, torch::Tensor cos, torch::Tensor sin,
                         torch::Tensor keys, torch::Tensor values, int64_t n_kv,
                         int64_t n_heads, double scaling) {
  TORCH_CHECK(x.dim() == 1 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "x must be a contiguous (hidden,) float32 tensor");
  TORCH_CHECK(keys.dim() == 4 && keys.size(0) == 1 && keys.is_contiguous() &&
              values.is_contiguous() && keys.sizes() == values.sizes() &&
              keys.scalar_type() == torch::kFloat32 && values.scalar_type() == torch::kFloat32,
              "keys / values must be contiguous (1, H_kv, C, D) float32 buffers");
  const int64_t hidden = x.size(0), n_kv_heads = keys.size(1), capacity = keys.size(2);
  const int64_t dim = keys.size(3);
  TORCH_CHECK(n_kv >= 0 && n_kv < capacity, "n_kv ", n_kv, " leaves no room in ", capacity);
  TORCH_CHECK(n_heads % n_kv_heads == 0, "query heads must be a multiple of KV heads");
  const int64_t q_rows = n_heads * dim, kv_rows = n_kv_heads * dim;
  TORCH_CHECK(qkv.size(0) == q_rows + 2 * kv_rows && out_proj.size(0) == hidden &&
              down.size(0) == hidden && gate_up.size(0) % 2 == 0,
              "the blocks do not have the layer's shapes");
  const int64_t inter = gate_up.size(0) / 2;
  check_blocks(qkv, qkv_type, hidden, "qkv");
  check_blocks(out_proj, out_type, q_rows, "out_proj");
  check_blocks(gate_up, gate_up_type, hidden, "gate_up");
  check_blocks(down, down_type, inter, "down");
  TORCH_CHECK(cos.numel() == dim && sin.numel() == dim && cos.is_contiguous() &&
              sin.is_contiguous(), "cos / sin must be contiguous (D,) tensors");

  auto result = x.clone();
  float* h = result.data_ptr<float>();
  std::vector<float> normed(std::max(hidden, inter)), proj(q_rows + 2 * kv_rows),
      attn(q_rows), mlp(2 * inter), delta(hidden);
  const float* cs = cos.data_ptr<float>();
  const float* sn = sin.data_ptr<float>();

  // Attention block.
  rms_norm(h, in_norm.data_ptr<float>(), in_eps, hidden, normed.data());
  gemm_raw(qkv_type, qkv.data_ptr<uint8_t>(), qkv.size(1), normed.data(), 1, hidden,
           proj.data(), qkv.size(0), false);
  float* q = proj.data();
  float* k = q + q_rows;
  float* v = k + kv_rows;
  for (int64_t head = 0; head < n_heads; ++head) rope(q + head * dim, cs, sn, dim);
  float* kb = keys.data_ptr<float>();
  float* vb = values.data_ptr<float>();
  for (int64_t head = 0; head < n_kv_heads; ++head) {
    rope(k + head * dim, cs, sn, dim);
    std::memcpy(kb + (head * capacity + n_kv) * dim, k + head * dim, dim * sizeof(float));
    std::memcpy(vb + (head * capacity + n_kv) * dim, v + head * dim, dim * sizeof(float));
  }
  const int64_t n_live = n_kv + 1, group = n_heads / n_kv_heads;
  const float scale = static_cast<float>(scaling);
  at::parallel_for(0, n_heads, 1, [&](int64_t h0, int64_t h1) {
    std::vector<float> scores(n_live);
    for (int64_t head = h0; head < h1; ++head) {
      const float* qh = q + head * dim;
      const float* kh = kb + (head / group) * capacity * dim;
      const float* vh = vb + (head / group) * capacity * dim;
      float best = -INFINITY;
      for (int64_t j = 0; j < n_live; ++j) {
        float s = 0.0f;
        // A dot product over the head dimension; the pragma lets the compiler vectorise the
        // sum (a reassociation, as any vectorised GEMM does).
#pragma omp simd reduction(+ : s)
        for (int64_t d = 0; d < dim; ++d) s += qh[d] * kh[j * dim + d];
        scores[j] = s * scale;
        best = std::max(best, scores[j]);
      }
      float total = 0.0f;
      for (int64_t j = 0; j < n_live; ++j) {
        scores[j] = std::exp(scores[j] - best);
        total += scores[j];
      }
      float* oh = attn.data() + head * dim;
      for (int64_t d = 0; d < dim; ++d) oh[d] = 0.0f;
      for (int64_t j = 0; j < n_live; ++j) {
        const float p = scores[j] / total;
        for (int64_t d = 0; d < dim; ++d) oh[d] += p * vh[j * dim + d];
      }
    }
  });
  gemm_raw(out_type, out_proj.data_ptr<uint8_t>(), out_proj.size(1), attn.data(), 1, q_rows,
           delta.data(), hidden, false);
  for (int64_t i = 0; i < hidden; ++i) h[i] += delta[i];

  // MLP block.
  rms_norm(h, post_norm.data_ptr<float>(), post_eps, hidden, normed.data());
  gemm_raw(gate_up_type, gate_up.data_ptr<uint8_t>(), gate_up.size(1), normed.data(), 1, hidden,
           mlp.data(), 2 * inter, false);
  for (int64_t i = 0; i < inter; ++i) {
    const float g = mlp[i];
    normed[i] = g / (1.0f + std::exp(-g)) * mlp[inter + i];
  }
  gemm_raw(down_type, down.data_ptr<uint8_t>(), down.size(1), normed.data(), 1, inter,
           delta.data(), hidden, false);
  for (int64_t i = 0; i < hidden; ++i) h[i] += delta[i];
  return result;
}

// Dequantize ``blocks`` (N, row_bytes) to fp32 (N, K) with the same arithmetic as the kernels.
torch::Tensor dequantize(torch::Tensor blocks, int64_t qtype, int64_t K) {
  const int64_t bb = block_bytes(qtype);
  TORCH_CHECK(bb > 0, "unsupported GGML type ", qtype, TYPES_HELP);
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == torch::kUInt8 &&
              blocks.is_contiguous() && blocks.size(1) == K / QK * bb && K % QK == 0,
              "blocks must be a contiguous (N, K / 32 * block bytes) uint8 tensor");
  TORCH_CHECK(!is_kquant(qtype) || K % QK_K == 0, "K must be a multiple of ", QK_K,
              " (a K-quant super-block) for type ", qtype, ", got ", K);
  const int64_t N = blocks.size(0), nb = K / QK;
  auto out = torch::empty({N, K}, torch::TensorOptions().dtype(torch::kFloat32));
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  with_qtype(qtype, [&](auto t) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t b = 0; b < nb; ++b)
        dequantize_block<decltype(t)::value>(w + n * blocks.size(1) + b * bb, o + n * K + b * QK);
  });
  return out;
}

bool has_avx2() { return TB_HAVE_AVX2; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemm", &gemm, "y = x W^T, W as GGUF blocks (Q4_0, Q4_1, Q8_0, repacked K-quants)");
  m.def("dequantize", &dequantize, "GGUF blocks -> fp32 weights");
  m.def("layer_step", &layer_step, "one decoder layer of a one-token step on GGUF blocks");
  m.def("has_avx2", &has_avx2, "True when the AVX2 + FMA + F16C path was compiled");
}
