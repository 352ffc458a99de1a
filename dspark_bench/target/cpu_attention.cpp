// Attention of a decode step on the CPU: a few query rows per (row, KV head) over the cache's K/V views.
//
// Why: in a decode step torch's SDPA (its flash kernel) spends most of its time on per-block overhead, not on the
// arithmetic (15-27 GFLOP/s at 1-32 rows of SmolLM2-135M in bf16), and at 16 rows it took 2.7x the time of vLLM's
// CPU attention kernel (baselines/kernels-vs-vllm/). This kernel does the plain thing for the shapes of a
// decode step, where each (row, KV head) has G query rows (the query heads of one KV head, packed as in
// fast.attention) and S columns:
//
//   scores[m][s] = (scale q_m) . k_s + bias[m][s]      one pass over K, each key row loaded once for the G queries
//   p[m] = softmax(scores[m])                          float32, a vectorised exp
//   out[m] = sum_s p[m][s] v_s                         one pass over V, each value row loaded once
//
// in float32 throughout (bf16 inputs widened on load, the output rounded to nearest even once), with GCC's
// portable vector types (16 floats; -march=native maps them to AVX-512 or to pairs of AVX2 registers). Work is
// split over the (row, KV head) pairs with ATen's parallel_for, so it runs on torch's own OpenMP threads.
// Python side: dspark_bench/target/kernels.py (build, fallback) and fast.attention (where it is used).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t W = 16;        // floats per vector
constexpr int64_t MAX_DIM = 128;  // head sizes up to this (Llama, Qwen3: 128; SmolLM2: 64)
typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));
typedef uint16_t vh __attribute__((vector_size(W * 2)));

inline vf splat(float x) { return vf{} + x; }

inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
inline vf load(const at::BFloat16* p) {  // a bf16 is the upper half of a float's bits
  vh h; std::memcpy(&h, p, sizeof h);
  vi bits = __builtin_convertvector(h, vi) << 16;
  vf v; std::memcpy(&v, &bits, sizeof v); return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline void store(at::BFloat16* p, vf v) {  // round to nearest even, as torch's float -> bf16 (no NaN arises here)
  vi bits; std::memcpy(&bits, &v, sizeof bits);
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
  vh h = __builtin_convertvector(bits & 0xFFFF, vh);
  std::memcpy(p, &h, sizeof h);
}
inline float widen(float x) { return x; }
inline float widen(at::BFloat16 x) { return static_cast<float>(x); }

inline float sum(vf v) {
  float s = 0.f;
  for (int64_t i = 0; i < W; ++i) s += v[i];
  return s;
}

// e^x for x <= 0 (a softmax's x - max), to float32's precision: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two
// parts, Cody-Waite), e^r by its Taylor polynomial of degree 8 (truncation below 1e-9 relative), times 2^n built in
// the exponent bits. Below -87.3 (e^x under float32's normal range, and every masked column, whose bias is the
// dtype's lowest value) it is exactly 0: a hole gets no weight.
inline vf exp_nonpositive(vf x) {
  const vf floor = splat(-87.3f);
  const vi masked = x < floor;
  x = masked ? floor : x;
  vf n = x * 1.44269504088896341f;
  n = __builtin_convertvector(__builtin_convertvector(n - 0.5f, vi), vf);  // round half away from 0, n <= 0
  const vf r = x - n * 0.693359375f - n * -2.12194440e-4f;
  vf p = splat(1.f / 40320.f);
  p = p * r + 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const vi exponent = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale; std::memcpy(&scale, &exponent, sizeof scale);
  return masked ? splat(0.f) : p * scale;
}

template <typename T>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& bias,
            float scale, at::Tensor& out) {
  const int64_t rows = q.size(0), heads = q.size(1), M = q.size(2), D = q.size(3), S = k.size(2), V = D / W;
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const T* bp = bias ? bias->data_ptr<T>() : nullptr;
  const int64_t bias_row = bias && bias->size(0) > 1 ? bias->stride(0) : 0, bias_query = bias ? bias->stride(2) : 0;
  at::parallel_for(0, rows * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(M * S), queries(M * D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / heads, h = i % heads;
      const T* keys = kp + r * k.stride(0) + h * k.stride(1);
      const T* values = vp + r * v.stride(0) + h * v.stride(1);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < V; ++j) store(&queries[m * D + j * W], load(qp + (i * M + m) * D + j * W) * scale);
      for (int64_t s = 0; s < S; ++s) {  // scores, each key row loaded once for the M queries
        vf key[MAX_DIM / W];
        for (int64_t j = 0; j < V; ++j) key[j] = load(keys + s * k.stride(2) + j * W);
        for (int64_t m = 0; m < M; ++m) {
          vf dot = load(&queries[m * D]) * key[0];
          for (int64_t j = 1; j < V; ++j) dot += load(&queries[m * D + j * W]) * key[j];
          scores[m * S + s] = sum(dot);
        }
      }
      for (int64_t m = 0; m < M; ++m) {  // softmax of each query's scores
        float* row = &scores[m * S];
        if (bp) {
          const T* b = bp + r * bias_row + m * bias_query;
          for (int64_t s = 0; s < S; ++s) row[s] += widen(b[s]);
        }
        float top = row[0];
        for (int64_t s = 1; s < S; ++s) top = row[s] > top ? row[s] : top;
        vf total = splat(0.f);
        int64_t s = 0;
        for (; s + W <= S; s += W) {
          const vf e = exp_nonpositive(load(row + s) - top);
          store(row + s, e);
          total += e;
        }
        float rest[W];  // the last S mod W columns, through the same exp (the unused lanes are -inf: exactly 0)
        for (int64_t t = 0; t < W; ++t) rest[t] = s + t < S ? row[s + t] - top : -INFINITY;
        const vf e = exp_nonpositive(load(rest));
        for (int64_t t = 0; s + t < S; ++t) row[s + t] = e[t];
        const float inverse = 1.f / (sum(total) + sum(e));
        for (s = 0; s < S; ++s) row[s] *= inverse;
      }
      for (int64_t m0 = 0; m0 < M; m0 += 4) {  // out = p V, four queries at a time, each value row loaded once
        const int64_t n = M - m0 < 4 ? M - m0 : 4;
        vf acc[4][MAX_DIM / W];
        for (int64_t m = 0; m < n; ++m)
          for (int64_t j = 0; j < V; ++j) acc[m][j] = splat(0.f);
        for (int64_t s = 0; s < S; ++s) {
          vf value[MAX_DIM / W];
          for (int64_t j = 0; j < V; ++j) value[j] = load(values + s * v.stride(2) + j * W);
          for (int64_t m = 0; m < n; ++m) {
            const vf p = splat(scores[(m0 + m) * S + s]);
            for (int64_t j = 0; j < V; ++j) acc[m][j] += p * value[j];
          }
        }
        for (int64_t m = 0; m < n; ++m)
          for (int64_t j = 0; j < V; ++j) store(op + (i * M + m0 + m) * D + j * W, acc[m][j]);
      }
    }
  });
}

}  // namespace

// q [R, H, M, D] contiguous; k, v [R, H, S, D] with unit stride over D (views of the cache); bias None or
// [1 or R, 1, M, S] additive with unit stride over S; all of q's dtype (float32 or bfloat16). -> [R, H, M, D].
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const c10::optional<at::Tensor>& bias, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be [R, H, M or S, D]");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "float32 or bfloat16 only");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "one dtype for q, k, v");
  TORCH_CHECK(q.is_contiguous() && q.size(3) % W == 0 && q.size(3) <= MAX_DIM, "q contiguous, D a multiple of 16 <= 128");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
              "k, v [R, H, S, D] for q [R, H, M, D]");
  TORCH_CHECK(k.size(2) >= 1 && k.stride(3) == 1 && v.stride(3) == 1, "k, v need a column and unit stride over D");
  if (bias) {
    TORCH_CHECK(bias->dim() == 4 && (bias->size(0) == 1 || bias->size(0) == q.size(0)) && bias->size(1) == 1 &&
                bias->size(2) == q.size(2) && bias->size(3) == k.size(2) && bias->stride(3) == 1 &&
                bias->scalar_type() == q.scalar_type(), "bias [1 or R, 1, M, S] of q's dtype, unit stride over S");
  }
  at::Tensor out = at::empty_like(q);
  if (q.scalar_type() == at::kBFloat16) attend<at::BFloat16>(q, k, v, bias, static_cast<float>(scale), out);
  else attend<float>(q, k, v, bias, static_cast<float>(scale), out);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("decode_attention", &decode_attention); }
