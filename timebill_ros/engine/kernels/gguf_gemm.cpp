// The GGUF kernels (gguf_core.h) bound to torch tensors: every tensor is checked (device,
// dtype, shape, layout) before its pointer reaches the core, and a bad one is a RuntimeError
// naming it. Built at first use on the machine that runs it (engine/kernels/__init__.py).

// Only the headers the binding uses, not <torch/extension.h>: that one pulls in all of
// libtorch's C++ API (autograd, nn, optim) and took 54 s of the first start's compile on two
// cores against 17 s for these (the same pybind11 binding, the same calls at run time).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

#include "gguf_core.h"

// The core's threads a call: torch's intra-op count of the calling thread (engine.threads).
int kernel_threads() { return at::get_num_threads(); }

namespace {

// Every tensor these kernels read or write is host memory: a CUDA (or other device) tensor's
// data_ptr would be dereferenced on the CPU, a crash rather than an error.
void check_cpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), what, " must be a CPU tensor (the GGUF kernels run on the "
              "CPU), got one on ", t.device());
}

void check_type_and_k(int64_t qtype, int64_t K) {
  TORCH_CHECK(block_bytes(qtype) > 0, "unsupported GGML type ", qtype, TYPES_HELP);
  TORCH_CHECK(K > 0 && K % QK == 0, "K must be a positive multiple of 32, got ", K);
  TORCH_CHECK(!is_kquant(qtype) || K % QK_K == 0, "K must be a multiple of ", QK_K,
              " (a K-quant super-block) for type ", qtype, ", got ", K);
}

// The packed bytes of one group of GROUP rows of K weights of ``qtype``.
int64_t group_bytes(int64_t qtype, int64_t K) { return GROUP * row_bytes(qtype, K); }

// ``packed`` must be ``pack``'s layout of N rows of K weights of type ``qtype``.
void check_packed(const at::Tensor& packed, int64_t qtype, int64_t K, int64_t N,
                  const char* what) {
  check_type_and_k(qtype, K);
  check_cpu(packed, what);
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte &&
              packed.is_contiguous(), what, " must be a contiguous packed uint8 tensor");
  TORCH_CHECK(N > 0 && packed.size(0) == (N + GROUP - 1) / GROUP &&
              packed.size(1) == group_bytes(qtype, K),
              what, ": packed blocks of shape ", packed.sizes(), " do not hold ", N, " rows of ",
              K, " weights of type ", qtype);
}

// The kernels' layout of ``blocks`` (N, row bytes), rows as the GGUF holds them:
// (ceil(N / GROUP), GROUP * row bytes).
at::Tensor pack(at::Tensor blocks, int64_t qtype, int64_t K) {
  check_type_and_k(qtype, K);
  check_cpu(blocks, "blocks");
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte &&
              blocks.is_contiguous() && blocks.size(1) == row_bytes(qtype, K),
              "blocks must be a contiguous (N, ", row_bytes(qtype, K), ") uint8 tensor for ", K,
              " weights of type ", qtype, ", got ", blocks.sizes());
  const int64_t N = blocks.size(0), groups = (N + GROUP - 1) / GROUP;
  auto out = at::zeros({groups, group_bytes(qtype, K)}, blocks.options());
  pack_raw(blocks.data_ptr<uint8_t>(), N, qtype, K, out.data_ptr<uint8_t>());
  return out;
}

// y (M, N) = x (M, K) W^T; W = ``packed`` (``pack`` of N rows of type ``qtype``).
// ``portable`` forces the scalar path (tests compare both).
at::Tensor gemm(at::Tensor x, at::Tensor packed, int64_t qtype, int64_t N,
                   bool portable) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous (M, K) float32 tensor");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(M >= 1 && M <= MAX_ROWS, "x must have 1 to ", MAX_ROWS, " rows, got ", M);
  check_packed(packed, qtype, K, N, "blocks");
  auto y = at::empty({M, N}, x.options());
  gemm_raw(qtype, packed.data_ptr<uint8_t>(), x.data_ptr<float>(), M, K, y.data_ptr<float>(),
           N, portable);
  return y;
}

// y (M, N) = x (M, K) W^T for any M >= 1 (a prefill chunk), reading the blocks of ``packed``
// directly (no dequantized matrix); a row's result does not depend on M.
at::Tensor gemm_tiled(at::Tensor x, at::Tensor packed, int64_t qtype, int64_t N, bool portable) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous (M, K) float32 tensor");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(M >= 1, "x must have at least one row");
  check_packed(packed, qtype, K, N, "blocks");
  auto y = at::empty({M, N}, x.options());
  gemm_tiled_raw(qtype, packed.data_ptr<uint8_t>(), x.data_ptr<float>(), M, K,
                 y.data_ptr<float>(), N, portable);
  return y;
}

// The KV buffers of M rows, checked: each (1, H_kv, C_r, D) float32, contiguous.
struct Caches {
  std::vector<float*> keys, values;
  std::vector<int64_t> capacity;
  int64_t n_kv_heads = 0, dim = 0;
};

Caches check_caches(const std::vector<at::Tensor>& keys,
                    const std::vector<at::Tensor>& values, int64_t M) {
  TORCH_CHECK(M >= 1 && static_cast<int64_t>(keys.size()) == M &&
              static_cast<int64_t>(values.size()) == M, "one cache a row");
  TORCH_CHECK(keys[0].dim() == 4, "keys / values must be (1, H_kv, C, D) buffers");
  Caches caches;
  caches.n_kv_heads = keys[0].size(1);
  caches.dim = keys[0].size(3);
  for (int64_t r = 0; r < M; ++r) {
    const auto& k = keys[r];
    const auto& v = values[r];
    check_cpu(k, "keys");
    check_cpu(v, "values");
    TORCH_CHECK(k.dim() == 4 && k.size(0) == 1 && k.size(1) == caches.n_kv_heads &&
                k.size(3) == caches.dim && k.is_contiguous() && v.is_contiguous() &&
                k.sizes() == v.sizes() && k.scalar_type() == at::kFloat &&
                v.scalar_type() == at::kFloat,
                "keys / values must be contiguous (1, H_kv, C, D) float32 buffers");
    caches.keys.push_back(k.data_ptr<float>());
    caches.values.push_back(v.data_ptr<float>());
    caches.capacity.push_back(k.size(2));
  }
  return caches;
}

}  // namespace

// Attention of one decoding step of M rows, each over its own cache, as layer_step's
// (flash-decoding on the kernels' threads; no torch op, so no OpenMP region between the
// kernels' GEMMs): q (M, n_heads * D) fp32, keys[r] / values[r] the (1, H_kv, C, D) buffers
// of row r, positions [first[r], first[r] + n_live[r]) attended (a sliding window starts
// after 0). Returns (M, n_heads * D).
at::Tensor attention_step(at::Tensor q, std::vector<at::Tensor> keys,
                             std::vector<at::Tensor> values, std::vector<int64_t> first,
                             std::vector<int64_t> n_live, int64_t n_heads, double scaling) {
  check_cpu(q, "q");
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kFloat && q.is_contiguous(),
              "q must be a contiguous (M, n_heads * D) float32 tensor");
  const int64_t M = q.size(0);
  TORCH_CHECK(static_cast<int64_t>(first.size()) == M &&
              static_cast<int64_t>(n_live.size()) == M, "first and n_live a row");
  Caches caches = check_caches(keys, values, M);
  const int64_t n_kv_heads = caches.n_kv_heads, dim = caches.dim;
  TORCH_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && q.size(1) == n_heads * dim,
              "q holds ", q.size(1), " values a row, not ", n_heads, " heads of ", dim,
              " (a multiple of ", n_kv_heads, " KV heads)");
  for (int64_t r = 0; r < M; ++r) {
    TORCH_CHECK(first[r] >= 0 && n_live[r] >= 1 && first[r] + n_live[r] <= caches.capacity[r],
                "positions [", first[r], ", ", first[r] + n_live[r], ") are not in the ",
                caches.capacity[r], " of row ", r);
    // A window starting later: the same head stride (capacity), the base moved on.
    caches.keys[r] += first[r] * dim;
    caches.values[r] += first[r] * dim;
  }
  auto out = at::empty_like(q);
  attention(q.data_ptr<float>(), caches.keys, caches.values, caches.capacity, n_live, n_heads,
            n_kv_heads, dim, static_cast<float>(scaling), out.data_ptr<float>());
  return out;
}

// Dequantize ``blocks`` (N, row_bytes) to fp32 (N, K) with the same arithmetic as the kernels.
at::Tensor dequantize(at::Tensor blocks, int64_t qtype, int64_t K) {
  check_type_and_k(qtype, K);
  check_cpu(blocks, "blocks");
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte &&
              blocks.is_contiguous() && blocks.size(1) == row_bytes(qtype, K),
              "blocks must be a contiguous (N, row bytes) uint8 tensor");
  auto out = at::empty({blocks.size(0), K}, at::TensorOptions().dtype(at::kFloat));
  dequantize_raw(blocks.data_ptr<uint8_t>(), blocks.size(0), qtype, K, out.data_ptr<float>());
  return out;
}

// Rows ``rows`` (R,) int64 of a packed matrix (``pack`` of N rows of K weights of type
// ``qtype``) as fp32 (R, K), each weight dequantized as gguf's reference does: the embedding
// rows of a step's tokens, or a whole matrix (rows 0..N-1) for one prefill chunk's GEMM, so
// that no fp32 copy of the model is kept. Rows split over the calling thread's pool.
at::Tensor unpack_rows(at::Tensor packed, int64_t qtype, int64_t K, int64_t N,
                          at::Tensor rows) {
  check_packed(packed, qtype, K, N, "blocks");
  check_cpu(rows, "rows");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.is_contiguous(),
              "rows must be a contiguous 1-D int64 tensor");
  const int64_t R = rows.size(0);
  const int64_t* index = rows.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r)
    TORCH_CHECK(index[r] >= 0 && index[r] < N, "row ", index[r], " is not in [0, ", N, ")");
  auto out = at::empty({R, K}, at::TensorOptions().dtype(at::kFloat));
  unpack_rows_raw(packed.data_ptr<uint8_t>(), qtype, K, index, R, out.data_ptr<float>());
  return out;
}

namespace {

// A linear layer held as several packed matrices (each one GEMM), their outputs side by side.
struct Parts {
  std::vector<at::Tensor> packed;
  std::vector<int64_t> types, rows;
  int64_t total = 0;
};

Parts make_parts(std::vector<at::Tensor> packed, std::vector<int64_t> types,
                 std::vector<int64_t> rows, int64_t K, const char* what) {
  TORCH_CHECK(!packed.empty() && packed.size() == types.size() && packed.size() == rows.size(),
              what, ": one type and row count a packed part");
  Parts parts{packed, types, rows, 0};
  for (size_t i = 0; i < packed.size(); ++i) {
    check_packed(packed[i], types[i], K, rows[i], what);
    parts.total += rows[i];
  }
  return parts;
}

// y (M, parts.total) = x (M, K) W^T, one GEMM a part into its columns.
void gemm_parts(const Parts& parts, const float* x, int64_t M, int64_t K, float* y) {
  int64_t column = 0;
  for (size_t i = 0; i < parts.packed.size(); ++i) {
    const int64_t n = parts.rows[i];
    float* part = parts.packed.size() == 1 ? y : scratch(PART, M * n);
    gemm_raw(parts.types[i], parts.packed[i].data_ptr<uint8_t>(), x, M, K, part, n, false);
    if (parts.packed.size() > 1)
      for (int64_t r = 0; r < M; ++r)
        std::memcpy(y + r * parts.total + column, part + r * n, n * sizeof(float));
    column += n;
  }
}

// An optional norm weight: empty (numel 0) means none.
const float* optional(const at::Tensor& t, int64_t n, const char* what) {
  if (t.numel() == 0) return nullptr;
  check_cpu(t, what);
  TORCH_CHECK(t.numel() == n && t.scalar_type() == at::kFloat && t.is_contiguous(),
              what, " must be a contiguous float32 tensor of ", n, " values, or empty");
  return t.data_ptr<float>();
}

}  // namespace

// One decoder layer of a decoding step of M goals for any GGUF family (engine/models): the
// layer_step above generalised. x (M, hidden) -> x + [post_attn_norm](attn) -> + [post_ffn_
// norm](mlp). qkv / gate_up: packed parts (q, k, v rows side by side; gate then up), in any
// mix of types; qkv_bias (q + k + v rows) or empty; q_norm / k_norm (D,) per-head RMSNorms or
// empty; activation 0 = SiLU, 1 = tanh-GELU. Row r's key / value go to position n_kv[r] of
// keys[r] / values[r] (1, H_kv, C_r, D); it attends over positions [first[r], n_kv[r]] (a
// sliding window starts later). All norms share ``eps``.
at::Tensor decoder_step(
    at::Tensor x, at::Tensor attn_norm, double eps, std::vector<at::Tensor> qkv,
    std::vector<int64_t> qkv_types, std::vector<int64_t> qkv_rows, at::Tensor qkv_bias,
    at::Tensor q_norm, at::Tensor k_norm, at::Tensor cos, at::Tensor sin,
    std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
    std::vector<int64_t> n_kv, std::vector<int64_t> first, int64_t n_heads, double scaling,
    at::Tensor out_proj, int64_t out_type, at::Tensor post_attn_norm,
    at::Tensor ffn_norm, std::vector<at::Tensor> gate_up,
    std::vector<int64_t> gate_up_types, std::vector<int64_t> gate_up_rows, int64_t activation,
    at::Tensor down, int64_t down_type, at::Tensor post_ffn_norm) {
  check_cpu(x, "x");
  check_cpu(cos, "cos");
  check_cpu(sin, "sin");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous (M, hidden) float32 tensor");
  const int64_t M = x.size(0), hidden = x.size(1);
  TORCH_CHECK(M >= 1 && M <= MAX_ROWS, "x must have 1 to ", MAX_ROWS, " rows, got ", M);
  TORCH_CHECK(static_cast<int64_t>(n_kv.size()) == M &&
              static_cast<int64_t>(first.size()) == M, "n_kv and first a row");
  Caches caches = check_caches(keys, values, M);
  const int64_t n_kv_heads = caches.n_kv_heads, dim = caches.dim;
  const std::vector<int64_t>& capacity = caches.capacity;
  TORCH_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0,
              "query heads must be a multiple of KV heads");
  TORCH_CHECK(activation == 0 || activation == 1, "activation must be 0 (SiLU) or 1 (GELU)");
  const int64_t q_rows = n_heads * dim, kv_rows = n_kv_heads * dim;
  const Parts qkv_parts = make_parts(qkv, qkv_types, qkv_rows, hidden, "qkv");
  TORCH_CHECK(qkv_parts.total == q_rows + 2 * kv_rows, "qkv holds ", qkv_parts.total,
              " rows, not q + k + v = ", q_rows + 2 * kv_rows);
  TORCH_CHECK(block_bytes(down_type) > 0 && down.dim() == 2, "down must be packed blocks");
  const int64_t inter = down.size(1) / (GROUP * block_bytes(down_type)) * block_weights(down_type);
  const Parts gate_up_parts = make_parts(gate_up, gate_up_types, gate_up_rows, hidden,
                                         "gate_up");
  TORCH_CHECK(gate_up_parts.total == 2 * inter, "gate_up holds ", gate_up_parts.total,
              " rows, not 2 x ", inter);
  check_packed(out_proj, out_type, q_rows, hidden, "out_proj");
  check_packed(down, down_type, inter, hidden, "down");
  const float* w_attn = optional(attn_norm, hidden, "attn_norm");
  const float* w_ffn = optional(ffn_norm, hidden, "ffn_norm");
  TORCH_CHECK(w_attn && w_ffn, "attn_norm and ffn_norm are needed");
  const float* w_post_attn = optional(post_attn_norm, hidden, "post_attn_norm");
  const float* w_post_ffn = optional(post_ffn_norm, hidden, "post_ffn_norm");
  const float* w_q = optional(q_norm, dim, "q_norm");
  const float* w_k = optional(k_norm, dim, "k_norm");
  const float* bias = optional(qkv_bias, qkv_parts.total, "qkv_bias");
  TORCH_CHECK(cos.numel() == M * dim && sin.numel() == M * dim && cos.is_contiguous() &&
              sin.is_contiguous() && cos.scalar_type() == at::kFloat &&
              sin.scalar_type() == at::kFloat,
              "cos / sin must be contiguous (M, D) float32 tensors");
  std::vector<float*> key_ptrs(M), value_ptrs(M);
  std::vector<int64_t> n_live(M);
  for (int64_t r = 0; r < M; ++r) {
    TORCH_CHECK(n_kv[r] >= 0 && n_kv[r] < capacity[r], "n_kv ", n_kv[r],
                " leaves no room in ", capacity[r]);
    TORCH_CHECK(first[r] >= 0 && first[r] <= n_kv[r], "first ", first[r], " is past n_kv ",
                n_kv[r]);
  }

  auto result = x.clone();
  float* h = result.data_ptr<float>();
  float* normed = scratch(NORMED, M * std::max(hidden, inter));
  float* proj = scratch(PROJ, M * qkv_parts.total);
  float* queries = scratch(QUERIES, M * q_rows);
  float* attn = scratch(ATTN, M * q_rows);
  float* mlp = scratch(MLP, M * 2 * inter);
  float* delta = scratch(DELTA, M * hidden);
  const float* cs = cos.data_ptr<float>();
  const float* sn = sin.data_ptr<float>();

  // Attention block.
  for (int64_t r = 0; r < M; ++r) rms_norm(h + r * hidden, w_attn, eps, hidden, normed + r * hidden);
  gemm_parts(qkv_parts, normed, M, hidden, proj);
  for (int64_t r = 0; r < M; ++r) {
    float* q = proj + r * qkv_parts.total;
    if (bias)
      for (int64_t i = 0; i < qkv_parts.total; ++i) q[i] += bias[i];
    float* k = q + q_rows;
    float* v = k + kv_rows;
    const float* cr = cs + r * dim;
    const float* sr = sn + r * dim;
    for (int64_t head = 0; head < n_heads; ++head) {
      if (w_q) rms_norm(q + head * dim, w_q, eps, dim, q + head * dim);
      rope(q + head * dim, cr, sr, dim);
    }
    std::memcpy(queries + r * q_rows, q, q_rows * sizeof(float));
    float* key_base = caches.keys[r];
    float* value_base = caches.values[r];
    for (int64_t head = 0; head < n_kv_heads; ++head) {
      if (w_k) rms_norm(k + head * dim, w_k, eps, dim, k + head * dim);
      rope(k + head * dim, cr, sr, dim);
      const int64_t at = (head * capacity[r] + n_kv[r]) * dim;
      std::memcpy(key_base + at, k + head * dim, dim * sizeof(float));
      std::memcpy(value_base + at, v + head * dim, dim * sizeof(float));
    }
    key_ptrs[r] = key_base + first[r] * dim;  // the same head stride, the base moved on
    value_ptrs[r] = value_base + first[r] * dim;
    n_live[r] = n_kv[r] + 1 - first[r];
  }
  attention(queries, key_ptrs, value_ptrs, capacity, n_live, n_heads, n_kv_heads, dim,
            static_cast<float>(scaling), attn);
  gemm_raw(out_type, out_proj.data_ptr<uint8_t>(), attn, M, q_rows, delta, hidden, false);
  if (w_post_attn)
    for (int64_t r = 0; r < M; ++r)
      rms_norm(delta + r * hidden, w_post_attn, eps, hidden, delta + r * hidden);
  for (int64_t i = 0; i < M * hidden; ++i) h[i] += delta[i];

  // MLP block.
  for (int64_t r = 0; r < M; ++r) rms_norm(h + r * hidden, w_ffn, eps, hidden, normed + r * hidden);
  gemm_parts(gate_up_parts, normed, M, hidden, mlp);
  for (int64_t r = 0; r < M; ++r) {
    if (activation == 0)
      silu_times(mlp + r * 2 * inter, inter, normed + r * inter);
    else
      gelu_tanh_times(mlp + r * 2 * inter, inter, normed + r * inter);
  }
  gemm_raw(down_type, down.data_ptr<uint8_t>(), normed, M, inter, delta, hidden, false);
  if (w_post_ffn)
    for (int64_t r = 0; r < M; ++r)
      rms_norm(delta + r * hidden, w_post_ffn, eps, hidden, delta + r * hidden);
  for (int64_t i = 0; i < M * hidden; ++i) h[i] += delta[i];
  return result;
}

// One decoder layer of a decoding step of M goals (one token each), every linear on GGUF
// blocks (Llama family, fp32: the lean forward's embedded model; decoder_step with one part
// a linear, no biases or extra norms, SiLU, no window): x (M, hidden) -> x + attn(...) -> + mlp(...). Row r's token
// is at RoPE angles cos[r] / sin[r] (M, D); its key and value are written at position n_kv[r]
// of keys[r] / values[r] (1, H_kv, C_r, D), whose capacity the caller ensured. One call
// instead of ~25 torch ops dispatched from Python, each weight block decoded once for all M
// rows; the caller still checks its interrupts before every layer.
at::Tensor layer_step(at::Tensor x, at::Tensor in_norm, double in_eps,
                         at::Tensor qkv, int64_t qkv_type, at::Tensor out_proj,
                         int64_t out_type, at::Tensor post_norm, double post_eps,
                         at::Tensor gate_up, int64_t gate_up_type, at::Tensor down,
                         int64_t down_type, at::Tensor cos, at::Tensor sin,
                         std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                         std::vector<int64_t> n_kv, int64_t n_heads, double scaling) {
  TORCH_CHECK(in_eps == post_eps, "the two norms' epsilons differ: ", in_eps, ", ", post_eps);
  TORCH_CHECK(!keys.empty() && keys[0].dim() == 4, "keys must be (1, H_kv, C, D) buffers");
  const int64_t dim = keys[0].size(3);
  const int64_t proj_rows = (n_heads + 2 * keys[0].size(1)) * dim;
  TORCH_CHECK(block_bytes(down_type) > 0 && down.dim() == 2, "down must be packed blocks");
  const int64_t inter = down.size(1) / (GROUP * block_bytes(down_type)) * block_weights(down_type);
  return decoder_step(x, in_norm, in_eps, {qkv}, {qkv_type}, {proj_rows}, at::empty({0}),
                      at::empty({0}), at::empty({0}), cos, sin, keys, values, n_kv,
                      std::vector<int64_t>(n_kv.size(), 0), n_heads, scaling, out_proj,
                      out_type, at::empty({0}), post_norm, {gate_up}, {gate_up_type},
                      {2 * inter}, 0, down, down_type, at::empty({0}));
}

bool has_avx2() { return TB_HAVE_AVX2; }

int64_t group_rows() { return GROUP; }

std::string simd_path_name() { return simd_path(); }

bool amx_prefill() {
#if TB_HAVE_AMX
  return amx_granted();
#else
  return false;
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The GIL is released while a kernel runs (the arguments are C++ tensors by then): another
  // executor's thread (the offload engine) runs its Python meanwhile.
  using no_gil = py::call_guard<py::gil_scoped_release>;
  m.def("pack", &pack, "GGUF blocks (N, row bytes) -> the kernels' layout (rows in groups)",
        no_gil());
  m.def("gemm", &gemm, "y = x W^T, W packed GGUF blocks (Q4_0/1, Q5_0/1, Q8_0, Q4_K, Q5_K, Q6_K)",
        no_gil());
  m.def("gemm_tiled", &gemm_tiled,
        "y = x W^T for any rows (a prefill chunk), W packed GGUF blocks read directly", no_gil());
  m.def("dequantize", &dequantize, "GGUF blocks -> fp32 weights", no_gil());
  m.def("unpack_rows", &unpack_rows, "rows of packed GGUF blocks -> fp32 weights", no_gil());
  m.def("layer_step", &layer_step,
        "one decoder layer of a decoding step of M goals on GGUF blocks", no_gil());
  m.def("decoder_step", &decoder_step,
        "one decoder layer of a decoding step of M goals, any GGUF family", no_gil());
  m.def("attention_step", &attention_step,
        "attention of one decoding step of M rows over their own caches", no_gil());
  m.def("has_avx2", &has_avx2, "True when the AVX2 + FMA + F16C path was compiled");
  m.def("simd_path", &simd_path_name,
        "the vector path compiled here: avx512, avx2, neon or portable (scalar only)");
  m.def("amx_prefill", &amx_prefill,
        "True when Q4_K / Q6_K prefill GEMMs run on AMX tiles (compiled here and granted by the OS)");
  m.def("group_rows", &group_rows,
        "weight rows a group of the packed layout (8, or 16 with AVX-512)");
}