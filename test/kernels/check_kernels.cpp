// Exactness checks of the GGUF kernels' torch-free core (timebill_ros/engine/kernels/
// gguf_core.h), as a program with no torch: test/test_kernels_core.py builds it with the
// host's compiler and, for the ARM cores, with Debian's aarch64 cross compiler, and runs that
// build under qemu-aarch64 (on an ARM board it builds natively). The same checks as
// test/test_gguf_kernels.py's on x86:
// - dequantization bit-exact to gguf's reference (the vectors file holds gguf's weights), and
//   any packed rows unpacked bit-exactly;
// - the GEMM, vector path and portable path, for 1-8 activation rows, within REL_TOL of the
//   float64 product of gguf's weights (relative to the largest output);
// - one block read wrong is seen (> 10 REL_TOL), so the bound can fail;
// - attention of a decoding step (grouped heads, chunks across ATTENTION_CHUNK, a window),
//   SiLU and tanh-GELU products, against float64 references.
//
// Usage: check_kernels VECTORS_FILE [THREADS]. The file (made by test/test_kernels_core.py from
// gguf's quantize / dequantize): "TBKV", int32 version 1, int32 cases; a case: int64 qtype,
// N, K, M; blocks (N rows of row_bytes(qtype, K), the file's row layout);
// weights float32 (N, K); x float32 (M, K); y float64 (M, N). Prints one line a check and
// "PASS simd=<path> group=<rows>" last; exits 1 on a failed check, 2 on a bad file.

#include <cstdio>
#include <cstdlib>
#include <random>

#include "gguf_core.h"

namespace {
int g_threads = 1;
}

int kernel_threads() { return g_threads; }

namespace {

constexpr double REL_TOL = 1e-5;  // as test/test_gguf_kernels.py
int g_failures = 0;

void report(bool ok, const char* what, double error, double bound) {
  std::printf("%s %s error=%.3g bound=%.3g\n", ok ? "ok" : "FAIL", what, error, bound);
  if (!ok) ++g_failures;
}

struct Case {
  int64_t qtype = 0, N = 0, K = 0, M = 0;
  std::vector<uint8_t> blocks;
  std::vector<float> weights, x;
  std::vector<double> y;
};

template <typename T>
bool read_into(std::FILE* f, T* data, size_t n) {
  return std::fread(data, sizeof(T), n, f) == n;
}

bool read_cases(const char* path, std::vector<Case>& cases) {
  std::FILE* f = std::fopen(path, "rb");
  if (!f) return false;
  char magic[4];
  int32_t version = 0, n_cases = 0;
  bool ok = read_into(f, magic, 4) && std::memcmp(magic, "TBKV", 4) == 0 &&
            read_into(f, &version, 1) && version == 1 && read_into(f, &n_cases, 1);
  for (int32_t i = 0; ok && i < n_cases; ++i) {
    Case c;
    int64_t head[4];
    ok = read_into(f, head, 4);
    if (!ok) break;
    c.qtype = head[0], c.N = head[1], c.K = head[2], c.M = head[3];
    const int64_t bb = block_bytes(c.qtype);
    ok = bb > 0 && c.N > 0 && c.K > 0 && c.K % block_weights(c.qtype) == 0 && c.M >= 1 &&
         c.M <= MAX_ROWS;
    if (!ok) break;
    c.blocks.resize(c.N * row_bytes(c.qtype, c.K));
    c.weights.resize(c.N * c.K);
    c.x.resize(c.M * c.K);
    c.y.resize(c.M * c.N);
    ok = read_into(f, c.blocks.data(), c.blocks.size()) &&
         read_into(f, c.weights.data(), c.weights.size()) &&
         read_into(f, c.x.data(), c.x.size()) && read_into(f, c.y.data(), c.y.size());
    cases.push_back(std::move(c));
  }
  std::fclose(f);
  return ok && !cases.empty();
}

double rel_error(const float* y, const double* ref, int64_t n) {
  double worst = 0.0, scale = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(y[i]) - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return scale > 0.0 ? worst / scale : worst;
}

// The float64 product of the first m rows of x and gguf's weights: y (m, N).
std::vector<double> reference(const Case& c, int64_t m) {
  std::vector<double> y(m * c.N, 0.0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t n = 0; n < c.N; ++n) {
      double s = 0.0;
      for (int64_t k = 0; k < c.K; ++k)
        s += static_cast<double>(c.x[r * c.K + k]) * c.weights[n * c.K + k];
      y[r * c.N + n] = s;
    }
  return y;
}

std::vector<uint8_t> packed_of(const Case& c, const std::vector<uint8_t>& blocks) {
  std::vector<uint8_t> packed((c.N + GROUP - 1) / GROUP * GROUP * row_bytes(c.qtype, c.K), 0);
  pack_raw(blocks.data(), c.N, c.qtype, c.K, packed.data());
  return packed;
}

// The offset in a block of 16 code bytes of its 32-weight chunk ``chunk``.
int64_t chunk_codes(int64_t qtype, int64_t chunk) {
  switch (qtype) {
    case Q4_K: return 16 + (chunk / 2) * QK;  // the nibbles of chunks 2 l and 2 l + 1
    case Q5_K: return 48 + (chunk / 2) * QK;
    case Q6_K: return (chunk / 4) * 64 + (chunk % 2) * QK;  // low nibbles of the half's ql
    default: return block_fields(qtype).code_at;
  }
}

void check_case(const Case& c) {
  char what[160];
  const int64_t bb = block_bytes(c.qtype);
  // Dequantization and unpacking, bit for bit.
  std::vector<float> w(c.N * c.K);
  dequantize_raw(c.blocks.data(), c.N, c.qtype, c.K, w.data());
  const bool same = std::memcmp(w.data(), c.weights.data(), w.size() * sizeof(float)) == 0;
  std::snprintf(what, sizeof(what), "type %lld: dequantize bit-exact to gguf (%lld x %lld)",
                static_cast<long long>(c.qtype), static_cast<long long>(c.N),
                static_cast<long long>(c.K));
  report(same, what, same ? 0.0 : 1.0, 0.0);
  const std::vector<uint8_t> packed = packed_of(c, c.blocks);
  std::vector<int64_t> rows;
  for (int64_t n = c.N - 1; n >= 0; n -= 3) rows.push_back(n);
  rows.push_back(0);
  std::vector<float> unpacked(rows.size() * c.K);
  unpack_rows_raw(packed.data(), c.qtype, c.K, rows.data(), static_cast<int64_t>(rows.size()),
                  unpacked.data());
  bool rows_same = true;
  for (size_t r = 0; r < rows.size(); ++r)
    rows_same = rows_same && std::memcmp(unpacked.data() + r * c.K,
                                         c.weights.data() + rows[r] * c.K,
                                         c.K * sizeof(float)) == 0;
  std::snprintf(what, sizeof(what), "type %lld: unpack_rows bit-exact (%zu rows)",
                static_cast<long long>(c.qtype), rows.size());
  report(rows_same, what, rows_same ? 0.0 : 1.0, 0.0);
  // The GEMM on both paths, 1..M rows; the file's y checks the reference itself.
  const std::vector<double> ref = reference(c, c.M);
  const double ref_vs_file = rel_error(std::vector<float>(ref.begin(), ref.end()).data(),
                                       c.y.data(), c.M * c.N);
  std::snprintf(what, sizeof(what), "type %lld: float64 reference agrees with the file's",
                static_cast<long long>(c.qtype));
  report(ref_vs_file < 1e-6, what, ref_vs_file, 1e-6);
  for (int portable = 0; portable < 2; ++portable)
    for (int64_t m = 1; m <= c.M; ++m) {
      std::vector<float> y(m * c.N);
      gemm_raw(c.qtype, packed.data(), c.x.data(), m, c.K, y.data(), c.N, portable != 0);
      const double e = rel_error(y.data(), ref.data(), m * c.N);
      std::snprintf(what, sizeof(what), "type %lld: gemm %s, %lld rows",
                    static_cast<long long>(c.qtype), portable ? "portable" : simd_path(),
                    static_cast<long long>(m));
      report(e < REL_TOL, what, e, REL_TOL);
    }
  // The prefill GEMM (any rows), both paths: within REL_TOL, and each row's result the same
  // bits in a chunk of 70 rows (x's rows repeated) as alone.
  for (int portable = 0; portable < 2; ++portable) {
    std::vector<float> y(c.M * c.N);
    gemm_tiled_raw(c.qtype, packed.data(), c.x.data(), c.M, c.K, y.data(), c.N, portable != 0);
    const double e = rel_error(y.data(), ref.data(), c.M * c.N);
    std::snprintf(what, sizeof(what), "type %lld: tiled gemm %s, %lld rows",
                  static_cast<long long>(c.qtype), portable ? "portable" : simd_path(),
                  static_cast<long long>(c.M));
    report(e < REL_TOL, what, e, REL_TOL);
    const int64_t big = 70;
    std::vector<float> xs(big * c.K), ys(big * c.N), one(c.N);
    for (int64_t r = 0; r < big; ++r)
      std::memcpy(xs.data() + r * c.K, c.x.data() + (r % c.M) * c.K, c.K * sizeof(float));
    gemm_tiled_raw(c.qtype, packed.data(), xs.data(), big, c.K, ys.data(), c.N, portable != 0);
    bool same_rows = true;
    for (int64_t r = 0; r < c.M; ++r) {
      gemm_tiled_raw(c.qtype, packed.data(), c.x.data() + r * c.K, 1, c.K, one.data(), c.N,
                     portable != 0);
      for (int64_t q = r; q < big; q += c.M)
        same_rows = same_rows && std::memcmp(ys.data() + q * c.N, one.data(),
                                             c.N * sizeof(float)) == 0;
    }
    std::snprintf(what, sizeof(what), "type %lld: tiled gemm %s, a row alone = in 70 rows",
                  static_cast<long long>(c.qtype), portable ? "portable" : simd_path());
    report(same_rows, what, same_rows ? 0.0 : 1.0, 0.0);
  }
  // One block read wrong: the codes of row 3's largest block (random K-quant scales may be
  // 0), nibbles flipped.
  int64_t largest = 0;
  double largest_abs = -1.0;
  for (int64_t b = 0; b < c.K / QK; ++b)
    for (int64_t j = 0; j < QK; ++j) {
      const double v = std::fabs(c.weights[3 * c.K + b * QK + j]);
      if (v > largest_abs) largest_abs = v, largest = b;
    }
  std::vector<uint8_t> broken = c.blocks;
  const int64_t per_block = block_weights(c.qtype) / QK;  // 32-weight chunks a block
  const int64_t at = 3 * row_bytes(c.qtype, c.K) + (largest / per_block) * bb +
                     chunk_codes(c.qtype, largest % per_block);
  for (int64_t j = 0; j < 16; ++j) broken[at + j] ^= 0x11;
  const std::vector<uint8_t> broken_packed = packed_of(c, broken);
  for (int portable = 0; portable < 2; ++portable) {
    std::vector<float> y(c.N);
    gemm_raw(c.qtype, broken_packed.data(), c.x.data(), 1, c.K, y.data(), c.N, portable != 0);
    const double e = rel_error(y.data(), ref.data(), c.N);
    std::snprintf(what, sizeof(what), "type %lld: a wrong block is seen (%s)",
                  static_cast<long long>(c.qtype), portable ? "portable" : simd_path());
    report(e > 10 * REL_TOL, what, e, 10 * REL_TOL);
  }
}

// Attention of one row over n_live cached tokens starting at ``first``, against float64.
void check_attention(std::mt19937& rng, int64_t n_heads, int64_t n_kv_heads, int64_t dim,
                     int64_t capacity, int64_t first, int64_t n_live) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(n_heads * dim), keys(n_kv_heads * capacity * dim),
      values(n_kv_heads * capacity * dim), out(n_heads * dim);
  for (auto& v : q) v = normal(rng);
  for (auto& v : keys) v = normal(rng);
  for (auto& v : values) v = normal(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  attention(q.data(), {keys.data() + first * dim}, {values.data() + first * dim}, {capacity},
            {n_live}, n_heads, n_kv_heads, dim, scale, out.data());
  const int64_t group = n_heads / n_kv_heads;
  std::vector<double> ref(n_heads * dim, 0.0);
  for (int64_t h = 0; h < n_heads; ++h) {
    const int64_t kv = h / group;
    std::vector<double> s(n_live);
    double best = -1e300, total = 0.0;
    for (int64_t j = 0; j < n_live; ++j) {
      const float* k = keys.data() + (kv * capacity + first + j) * dim;
      double dot = 0.0;
      for (int64_t d = 0; d < dim; ++d) dot += static_cast<double>(q[h * dim + d]) * k[d];
      s[j] = dot * scale;
      best = std::max(best, s[j]);
    }
    for (int64_t j = 0; j < n_live; ++j) total += s[j] = std::exp(s[j] - best);
    for (int64_t j = 0; j < n_live; ++j) {
      const float* v = values.data() + (kv * capacity + first + j) * dim;
      for (int64_t d = 0; d < dim; ++d) ref[h * dim + d] += s[j] / total * v[d];
    }
  }
  const double e = rel_error(out.data(), ref.data(), n_heads * dim);
  char what[160];
  std::snprintf(what, sizeof(what), "attention: %lld heads on %lld KV heads, dim %lld, "
                "tokens [%lld, %lld)", static_cast<long long>(n_heads),
                static_cast<long long>(n_kv_heads), static_cast<long long>(dim),
                static_cast<long long>(first), static_cast<long long>(first + n_live));
  report(e < REL_TOL, what, e, REL_TOL);
}

// SiLU and tanh-GELU products over n values (the vector loop and its scalar tail) within 1e-6
// of float64, relative to the largest (1 + tanh near -1 cancels in float, as in torch's).
void check_activations(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> gate(2 * n), out(n);
  for (auto& v : gate) v = normal(rng);
  gate[0] = -100.0f;  // exp's clamp
  gate[1] = 90.0f;
  for (int act = 0; act < 2; ++act) {
    if (act == 0)
      silu_times(gate.data(), n, out.data());
    else
      gelu_tanh_times(gate.data(), n, out.data());
    std::vector<double> ref(n);
    for (int64_t i = 0; i < n; ++i) {
      const double g = gate[i], up = gate[n + i];
      ref[i] = act == 0 ? g / (1.0 + std::exp(-g)) * up
                        : 0.5 * g * (1.0 + std::tanh(0.7978845608028654 *
                                                     (g + 0.044715 * g * g * g))) * up;
    }
    const double worst = rel_error(out.data(), ref.data(), n);
    char what[96];
    std::snprintf(what, sizeof(what), "%s products over %lld values", act ? "GELU" : "SiLU",
                  static_cast<long long>(n));
    report(worst < 1e-6, what, worst, 1e-6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s VECTORS_FILE [THREADS]\n", argv[0]);
    return 2;
  }
  g_threads = argc > 2 ? std::max(1, std::atoi(argv[2])) : 1;
  std::vector<Case> cases;
  if (!read_cases(argv[1], cases)) {
    std::fprintf(stderr, "cannot read the vectors in %s\n", argv[1]);
    return 2;
  }
  std::printf("simd=%s group=%lld threads=%d cases=%zu\n", simd_path(),
              static_cast<long long>(GROUP), g_threads, cases.size());
  for (const Case& c : cases) check_case(c);
  std::mt19937 rng(7);
  check_attention(rng, 9, 3, 64, 700, 0, 700);   // GQA 3, two chunks of 512
  check_attention(rng, 4, 4, 48, 40, 5, 33);     // dim not a multiple of 32; a window
  check_attention(rng, 2, 1, 64, 1, 0, 1);       // one token
  check_attention(rng, 8, 1, 36, 300, 10, 290);  // dim 36: the scalar values path
  check_attention(rng, 12, 2, 128, 700, 0, 700); // group of 6: values in passes of 4 + 2
  check_attention(rng, 7, 1, 64, 300, 0, 300);    // group of 7: passes of 4 + 3
  check_activations(rng, 1003);
  if (g_failures > 0) {
    std::printf("FAIL %d checks simd=%s\n", g_failures, simd_path());
    return 1;
  }
  std::printf("PASS simd=%s group=%lld\n", simd_path(), static_cast<long long>(GROUP));
  return 0;
}
