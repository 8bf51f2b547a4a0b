// fastnli's ONNX Runtime custom operator library (CPU): DeBERTa v1's self-attention, from the fused q/k/v projection
// to the context, in one pass per (pair, head).
//
// Operator ``ai.fastnli::DisentangledAttention`` (version 1), float32 (masked: bool):
//   inputs   qkv    (B, L, 3 H d)      the in_proj output: per head, d query, d key and d value columns
//            q_bias (H d values)       added to the queries, which are then divided by scale
//            v_bias (H d values)       added to the values
//            scale  (one value)        the queries' divisor (sqrt(d x the position terms' scale factor))
//            pkT    (..., H, d, 2L)    the position keys, transposed (the relative shift's 2L positions)
//            pqT    (..., H, d, 2L)    the scaled position queries, transposed
//            masked (..., L|1, L)      the positions the softmax leaves out
//            fill   (one value)        the score a left-out position gets (the graph's float min)
//   output   (B, L, H d)               the context: per head, probabilities x values, heads side by side
// with per head q = (qkv_q + q_bias) / scale, k = qkv_k, v = qkv_v + v_bias,
//   scores[i, j] = q_i . k_j + q_i . pk[L - 1 - i + j] + k_j . pq[L - j + i],
//   probabilities = softmax over j of where(masked, fill, scores).
// pkT, pqT and masked's leading dimensions broadcast to (B, H) (the exported graph's (1, H) and (B, 1)). The
// (B x H) blocks are shared out over the session's intra-op thread pool. Per layer it replaces the exported graph's
// head split (Reshape, Transpose, three Slices, the bias Adds and the Div), the three fp32 MatMuls of the scores
// (q.kT, q.pkT, k.pqT: the last two (B, H, L, 2L) wide), the bands' Reshape -> Slice -> Reshape -> Slice chains, the
// Transpose and two Adds, the mask's Where, the Softmax, the MatMul with the values and the heads' merge (Transpose,
// Reshape) (fastnli/exporter/attention.py writes them; fastnli/engine/fused_attention.py rewrites them): each score
// is three fused multiply-adds per k, about 3 L^2 d per block instead of 5 L^2 d, no (B, H, L, 2L) tensor is
// written, each row's softmax runs while the row is in L1, and no head's q, k, v or context is copied through memory
// between operators. The sums run in another order than the graph's, so results differ from it by float rounding
// (relative 1e-6).
//
// Kernels for AVX-512F and AVX2+FMA are chosen at run time (GCC on x86-64; FASTNLI_OPERATOR_ISA=avx2 or generic
// caps the choice); elsewhere a 4-lane generic kernel runs, slower than ORT's own GEMMs, and FastnliVectorWidth()
// says so to fastnli, which then leaves the graph plain.
//
// Built against ONNX Runtime's C API header only (include/, MIT, from the onnxruntime 1.29 headers); it asks the
// runtime for API version 17 (onnxruntime >= 1.17, for KernelContext_ParallelFor), so any later runtime loads it.

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "onnxruntime_c_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FASTNLI_X86_KERNELS 1
#include <immintrin.h>
#endif

namespace {

// One (batch, head) block for the probabilities kernel (attention_kernel.inc): the operands as that file describes
// them, scratch for the two bands of rows longer than kBandInTile (L rows each, band_stride floats apart: Lp + kRows -
// 1 rounded up to whole vectors), and the mask with the stride of its rows (0: one row for all) and the fill value.
// Floats in front of HeadArgs::keys_band that its first block of rows may write (kRows - 1 at most).
constexpr int64_t kKeysBandMargin = 16;

struct HeadArgs {
  const float* q;
  const float* kT;
  const float* pk;
  const float* pq;
  float* out;
  float* band;
  float* keys_band;
  int64_t band_stride, L, d, Lp, Pp;
  const bool* masked;
  int64_t mask_row_stride;
  float fill;
};

// The constants of Exp (attention_kernel.inc): e^x for x <= 0 (a softmax's shifted scores) as 2^n p(r), Cephes'
// degree-6 polynomial on r = x - n ln 2; 0 below -87.3, where 2^n would leave the normal floats.
constexpr float kExpLow = -87.33654f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2High = 0.693359375f;
constexpr float kLn2Low = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

#ifdef FASTNLI_X86_KERNELS
#pragma GCC push_options
#pragma GCC target("avx2,fma")
// dst[r, c] += src[c, r] for r, c < 8 (rows ss and ds floats apart): an 8 x 8 transpose in registers, for the
// AVX-512 and AVX2 kernels' AddTransposed.
inline void AddTransposed8(const float* src, int64_t ss, float* dst, int64_t ds) {
  __m256 r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(src + k * ss);
  for (int k = 0; k < 8; k += 2) {  // per 128-bit half: rows k, k + 1 interleaved
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {  // r[k + c]: column c (low half) and c + 4 (high half) of rows k..k + 3
    r[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {  // t[c]: column c of all eight rows
    t[c] = _mm256_permute2f128_ps(r[c], r[c + 4], 0x20);
    t[c + 4] = _mm256_permute2f128_ps(r[c], r[c + 4], 0x31);
  }
  for (int k = 0; k < 8; ++k) _mm256_storeu_ps(dst + k * ds, _mm256_add_ps(_mm256_loadu_ps(dst + k * ds), t[k]));
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
namespace avx512 {
typedef __m512 V;
constexpr int W = 16, kRows = 4, kCols = 2, kBandCols = 4, kBandInTile = 32, kValueRows = 8, kValueCols = 2;
inline V Zero() { return _mm512_setzero_ps(); }
inline V Load(const float* p) { return _mm512_loadu_ps(p); }
inline void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V Splat(float s) { return _mm512_set1_ps(s); }
inline V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V Max(V a, V b) { return _mm512_max_ps(a, b); }
inline float ReduceMax(V v) { return _mm512_reduce_max_ps(v); }
inline float ReduceAdd(V v) { return _mm512_reduce_add_ps(v); }
inline V Round(V x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline V Pow2(V n) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
inline V KeepAtLeast(V x, V low, V value) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, low, _CMP_GE_OQ), value); }
constexpr int kTranspose = 8;
inline void AddTransposed(const float* src, int64_t ss, float* dst, int64_t ds) { AddTransposed8(src, ss, dst, ds); }
inline V Masked(const bool* m, V fill, V x) {
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m)));
  return _mm512_mask_blend_ps(_mm512_test_epi32_mask(bytes, bytes), x, fill);
}
#include "attention_kernel.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
typedef __m256 V;
constexpr int W = 8, kRows = 4, kCols = 2, kBandCols = 2, kBandInTile = 32, kValueRows = 4, kValueCols = 2;
inline V Zero() { return _mm256_setzero_ps(); }
inline V Load(const float* p) { return _mm256_loadu_ps(p); }
inline void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V Splat(float s) { return _mm256_set1_ps(s); }
inline V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V Max(V a, V b) { return _mm256_max_ps(a, b); }
inline float ReduceMax(V v) {
  alignas(32) float lanes[W];
  _mm256_store_ps(lanes, v);
  return *std::max_element(lanes, lanes + W);
}
inline float ReduceAdd(V v) {
  alignas(32) float lanes[W];
  _mm256_store_ps(lanes, v);
  float sum = 0.0f;
  for (float x : lanes) sum += x;
  return sum;
}
inline V Round(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline V Pow2(V n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline V KeepAtLeast(V x, V low, V value) { return _mm256_and_ps(_mm256_cmp_ps(x, low, _CMP_GE_OQ), value); }
constexpr int kTranspose = 8;
inline void AddTransposed(const float* src, int64_t ss, float* dst, int64_t ds) { AddTransposed8(src, ss, dst, ds); }
inline V Masked(const bool* m, V fill, V x) {
  const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m)));
  return _mm256_blendv_ps(x, fill, _mm256_castsi256_ps(_mm256_cmpgt_epi32(bytes, _mm256_setzero_si256())));
}
#include "attention_kernel.inc"
}  // namespace avx2
#pragma GCC pop_options
#endif

namespace generic {
typedef float V __attribute__((vector_size(16)));
constexpr int W = 4, kRows = 4, kCols = 2, kBandCols = 2, kBandInTile = 32, kValueRows = 4, kValueCols = 2;
inline V Zero() { return V{}; }
inline V Load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
inline void Store(float* p, V v) { std::memcpy(p, &v, sizeof(V)); }
inline V Splat(float s) { return V{} + s; }
inline V Fma(V a, V b, V c) { return a * b + c; }
inline V Max(V a, V b) { return a > b ? a : b; }
inline float ReduceMax(V v) { return std::max(std::max(v[0], v[1]), std::max(v[2], v[3])); }
inline float ReduceAdd(V v) { return (v[0] + v[1]) + (v[2] + v[3]); }
inline V Round(V x) {
  return V{std::nearbyint(x[0]), std::nearbyint(x[1]), std::nearbyint(x[2]), std::nearbyint(x[3])};
}
inline V Pow2(V n) {
  return V{std::ldexp(1.0f, static_cast<int>(n[0])), std::ldexp(1.0f, static_cast<int>(n[1])),
           std::ldexp(1.0f, static_cast<int>(n[2])), std::ldexp(1.0f, static_cast<int>(n[3]))};
}
inline V KeepAtLeast(V x, V low, V value) { return x >= low ? value : V{}; }
constexpr int kTranspose = 4;
inline void AddTransposed(const float* src, int64_t ss, float* dst, int64_t ds) {
  for (int r = 0; r < kTranspose; ++r) {
    for (int c = 0; c < kTranspose; ++c) dst[r * ds + c] += src[c * ss + r];
  }
}
inline V Masked(const bool* m, V fill, V x) {
  return V{m[0] ? fill[0] : x[0], m[1] ? fill[1] : x[1], m[2] ? fill[2] : x[2], m[3] ? fill[3] : x[3]};
}
#include "attention_kernel.inc"
}  // namespace generic

typedef void (*ProbabilitiesFn)(const HeadArgs&);
typedef void (*ValuesFn)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t);

struct Isa {
  int width, rows, band_in_tile;
  ProbabilitiesFn probabilities;
  ValuesFn values;
};

// The widest kernel this CPU runs, or a narrower one named by FASTNLI_OPERATOR_ISA (avx2 or generic: for tests and
// for CPUs that slow their clock under AVX-512).
Isa Pick() {
  const char* asked = std::getenv("FASTNLI_OPERATOR_ISA");  // fastnli checks the value before loading the library
  std::string cap = asked == nullptr ? "" : asked;
  cap.erase(std::remove_if(cap.begin(), cap.end(), [](unsigned char c) { return std::isspace(c) != 0; }), cap.end());
  for (char& c : cap) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
#ifdef FASTNLI_X86_KERNELS
  __builtin_cpu_init();
  if (cap != "avx2" && cap != "generic" && __builtin_cpu_supports("avx512f")) {
    return {avx512::W, avx512::kRows, avx512::kBandInTile, avx512::Probabilities, avx512::Values};
  }
  if (cap != "generic" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return {avx2::W, avx2::kRows, avx2::kBandInTile, avx2::Probabilities, avx2::Values};
  }
#endif
  return {generic::W, generic::kRows, generic::kBandInTile, generic::Probabilities, generic::Values};
}

const Isa g_isa = Pick();

constexpr uint32_t kApiVersion = 17;
const char* const kDomain = "ai.fastnli";
const char* const kOpName = "DisentangledAttention";
constexpr size_t kInputs = 8;  // qkv, q_bias, v_bias, scale, pkT, pqT, masked, fill

const OrtApi* g_api = nullptr;

OrtStatus* Fail(const std::string& message) {
  return g_api->CreateStatus(ORT_INVALID_ARGUMENT, (std::string(kOpName) + ": " + message).c_str());
}

OrtStatus* Shape(const OrtValue* value, std::vector<int64_t>* dims) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (OrtStatus* s = g_api->GetTensorTypeAndShape(value, &info)) return s;
  size_t n = 0;
  OrtStatus* s = g_api->GetDimensionsCount(info, &n);
  if (s == nullptr) {
    dims->assign(n, 0);
    s = g_api->GetDimensions(info, dims->data(), n);
  }
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  return s;
}

// For an input whose leading dimensions ``lead`` broadcast to the blocks' (``blocks``: (B, H); numpy's rules:
// aligned from the right, each 1 or the blocks'), the stride in the input's blocks of each of the blocks' dimensions
// (0 where broadcast); false where they do not broadcast.
bool BlockStrides(const std::vector<int64_t>& lead, const std::vector<int64_t>& blocks, std::vector<int64_t>* strides) {
  if (lead.size() > blocks.size()) return false;
  strides->assign(blocks.size(), 0);
  int64_t stride = 1;
  for (size_t a = lead.size(); a-- > 0;) {
    const size_t ba = blocks.size() - lead.size() + a;
    if (lead[a] != 1 && lead[a] != blocks[ba]) return false;
    if (lead[a] != 1) (*strides)[ba] = stride;
    stride *= lead[a];
  }
  return true;
}

// The input's block that block ``n`` (row-major over ``blocks``) reads.
int64_t BlockOf(int64_t n, const std::vector<int64_t>& blocks, const std::vector<int64_t>& strides) {
  int64_t block = 0;
  for (size_t a = blocks.size(); a-- > 0;) {
    block += (n % blocks[a]) * strides[a];
    n /= blocks[a];
  }
  return block;
}

// One call's operands, shared by the thread pool's workers.
struct Blocks {
  const float* qkv;
  const float* q_bias;
  const float* v_bias;
  float scale;
  const float* pk;  // the padded position keys, (position blocks, d, Pp)
  const float* pq;  // the padded position queries, (position blocks, d, Pp); reversed for rows up to kBandInTile
  const bool* masked;
  float fill;
  float* context;
  int64_t H, L, d, Lp, Pp, dp, band_stride, mask_rows;
  std::vector<int64_t> lead, position_strides, mask_strides;  // lead: (B, H)
};

// Block n = (b, h): the head's q, kT (zero-padded to whole vectors) and values (likewise) from qkv into this thread's
// scratch, its probabilities, then its context columns.
void RunBlock(void* data, size_t index) {
  const Blocks& w = *static_cast<const Blocks*>(data);
  const int64_t n = static_cast<int64_t>(index), H = w.H, L = w.L, d = w.d, Lp = w.Lp, dp = w.dp;
  const int64_t b = n / H, h = n % H, row = 3 * H * d;
  thread_local std::vector<float> q, keys, values, probabilities, band, keys_band;
  q.resize(L * d);
  const bool long_rows = L > g_isa.band_in_tile;  // the bands' scratch is for them only
  if (long_rows) {
    band.resize(L * w.band_stride);
    keys_band.resize(kKeysBandMargin + Lp * w.band_stride);
  }
  keys.resize(d * Lp);
  values.resize(L * dp);
  probabilities.resize(L * Lp);
  const float* qb = w.q_bias + h * d;
  const float* vb = w.v_bias + h * d;
  const float inverse = 1.0f / w.scale;  // the graph divides; this rounds once more (relative 6e-8)
  const float* head = w.qkv + b * L * row + h * 3 * d;
  for (int64_t i = 0; i < L; ++i) {
    const float* src = head + i * row;
    float* qi = q.data() + i * d;
    float* vi = values.data() + i * dp;
    for (int64_t k = 0; k < d; ++k) qi[k] = (src[k] + qb[k]) * inverse;
    for (int64_t k = 0; k < d; ++k) vi[k] = src[2 * d + k] + vb[k];
    std::fill(vi + d, vi + dp, 0.0f);
  }
  for (int64_t k = 0; k < d; ++k) {
    float* kk = keys.data() + k * Lp;
    for (int64_t i = 0; i < L; ++i) kk[i] = head[i * row + d + k];
    std::fill(kk + L, kk + Lp, 0.0f);
  }
  const int64_t p = BlockOf(n, w.lead, w.position_strides);
  const bool* masked = w.masked + BlockOf(n, w.lead, w.mask_strides) * w.mask_rows * L;
  const HeadArgs args{q.data(),
                      keys.data(),
                      w.pk + p * d * w.Pp,
                      w.pq + p * d * w.Pp,
                      probabilities.data(),
                      long_rows ? band.data() : nullptr,
                      long_rows ? keys_band.data() + kKeysBandMargin : nullptr,
                      w.band_stride,
                      L,
                      d,
                      Lp,
                      w.Pp,
                      masked,
                      w.mask_rows == 1 ? 0 : L,
                      w.fill};
  g_isa.probabilities(args);
  g_isa.values(probabilities.data(), values.data(), w.context + b * L * H * d + h * d, H * d, L, Lp, d, dp);
}

// The one value of a scalar input, or an error naming it.
OrtStatus* OneValue(const OrtValue* value, const char* name, float* out) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (OrtStatus* s = g_api->GetTensorTypeAndShape(value, &info)) return s;
  size_t count = 0;
  OrtStatus* s = g_api->GetTensorShapeElementCount(info, &count);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  if (s != nullptr) return s;
  if (count != 1) return Fail(std::string(name) + " must be one value");
  void* data = nullptr;
  if (OrtStatus* e = g_api->GetTensorMutableData(const_cast<OrtValue*>(value), &data)) return e;
  *out = *static_cast<const float*>(data);
  return nullptr;
}

int64_t Count(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t x : dims) n *= x;
  return n;
}

OrtStatus* ORT_API_CALL Compute(void*, OrtKernelContext* context) {
  const OrtValue* inputs[kInputs] = {};
  std::vector<int64_t> dims[kInputs];
  void* data[kInputs] = {};
  for (size_t k = 0; k < kInputs; ++k) {
    if (OrtStatus* s = g_api->KernelContext_GetInput(context, k, &inputs[k])) return s;
    if (inputs[k] == nullptr) return Fail("input " + std::to_string(k) + " is missing");
    if (OrtStatus* s = Shape(inputs[k], &dims[k])) return s;
    if (OrtStatus* s = g_api->GetTensorMutableData(const_cast<OrtValue*>(inputs[k]), &data[k])) return s;
  }
  const char* const positions_error = "pkT and pqT must be (..., H, d, 2L) alike, their leading dimensions "
                                      "broadcast to (B, H)";
  const std::vector<int64_t>& pos = dims[4];
  if (dims[4] != dims[5] || pos.size() < 3) return Fail(positions_error);
  const int64_t H = pos[pos.size() - 3], d = pos[pos.size() - 2];
  const std::vector<int64_t>& qkv = dims[0];
  if (qkv.size() != 3 || qkv[2] != 3 * H * d) return Fail("qkv must be (B, L, 3 H d) with pkT's H and d");
  const int64_t B = qkv[0], L = qkv[1];
  Blocks w{};
  w.lead = {B, H};
  if (pos.back() != 2 * L ||
      !BlockStrides(std::vector<int64_t>(pos.begin(), pos.end() - 2), w.lead, &w.position_strides)) {
    return Fail(positions_error);
  }
  if (Count(dims[1]) != H * d || Count(dims[2]) != H * d) return Fail("q_bias and v_bias must hold H d values");
  const std::vector<int64_t>& m = dims[6];
  if (m.size() < 2 || m.back() != L || (m[m.size() - 2] != L && m[m.size() - 2] != 1) ||
      !BlockStrides(std::vector<int64_t>(m.begin(), m.end() - 2), w.lead, &w.mask_strides)) {
    return Fail("masked must be (..., L or 1, L), its leading dimensions broadcast to (B, H)");
  }
  if (OrtStatus* s = OneValue(inputs[3], "scale", &w.scale)) return s;
  if (OrtStatus* s = OneValue(inputs[7], "fill", &w.fill)) return s;
  const int64_t out_dims[3] = {B, L, H * d};
  OrtValue* output = nullptr;
  if (OrtStatus* s = g_api->KernelContext_GetOutput(context, 0, out_dims, 3, &output)) return s;
  void* out = nullptr;
  if (OrtStatus* s = g_api->GetTensorMutableData(output, &out)) return s;
  if (B == 0 || L == 0 || H == 0) return nullptr;
  if (d == 0) return nullptr;  // an empty context

  // The position inputs padded by two vectors, once per call; the queries reversed along the positions for rows up to
  // kBandInTile long.
  const int64_t W = g_isa.width, P = 2 * L;
  w.Lp = (L + W - 1) / W * W;
  w.Pp = P + 2 * W;
  w.band_stride = (w.Lp + g_isa.rows - 1 + W - 1) / W * W;
  w.dp = (d + W - 1) / W * W;
  const int64_t rows = Count(std::vector<int64_t>(pos.begin(), pos.end() - 1));  // position blocks x d
  std::vector<float> pk(rows * w.Pp, 0.0f), pq(rows * w.Pp, 0.0f);
  const float* pkt = static_cast<const float*>(data[4]);
  const float* pqt = static_cast<const float*>(data[5]);
  const bool reversed = L <= g_isa.band_in_tile;
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(pkt + r * P, pkt + (r + 1) * P, pk.begin() + r * w.Pp);
    if (reversed) {
      std::reverse_copy(pqt + r * P, pqt + (r + 1) * P, pq.begin() + r * w.Pp);
    } else {
      std::copy(pqt + r * P, pqt + (r + 1) * P, pq.begin() + r * w.Pp);
    }
  }
  w.qkv = static_cast<const float*>(data[0]);
  w.q_bias = static_cast<const float*>(data[1]);
  w.v_bias = static_cast<const float*>(data[2]);
  w.pk = pk.data();
  w.pq = pq.data();
  w.masked = static_cast<const bool*>(data[6]);
  w.mask_rows = m[m.size() - 2];
  w.context = static_cast<float*>(out);
  w.H = H;
  w.L = L;
  w.d = d;
  return g_api->KernelContext_ParallelFor(context, RunBlock, static_cast<size_t>(B * H), 0, &w);
}

OrtStatus* ORT_API_CALL CreateKernel(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*, void** kernel) {
  static int stateless = 0;  // the operator keeps no state between calls
  *kernel = &stateless;
  return nullptr;
}

void ORT_API_CALL DestroyKernel(void*) {}
const char* ORT_API_CALL Name(const OrtCustomOp*) { return kOpName; }
const char* ORT_API_CALL Provider(const OrtCustomOp*) { return "CPUExecutionProvider"; }
ONNXTensorElementDataType ORT_API_CALL InputType(const OrtCustomOp*, size_t index) {
  return index == 6 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
ONNXTensorElementDataType ORT_API_CALL FloatType(const OrtCustomOp*, size_t) {
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
size_t ORT_API_CALL InputCount(const OrtCustomOp*) { return kInputs; }
size_t ORT_API_CALL OneOutput(const OrtCustomOp*) { return 1; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL Required(const OrtCustomOp*, size_t) {
  return INPUT_OUTPUT_REQUIRED;
}
OrtMemType ORT_API_CALL DefaultMemory(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL One(const OrtCustomOp*) { return 1; }
int ORT_API_CALL Homogeneous(const OrtCustomOp*) { return 1; }

OrtCustomOp MakeOp() {
  OrtCustomOp op{};
  op.version = kApiVersion;
  op.GetName = Name;
  op.GetExecutionProviderType = Provider;
  op.GetInputType = InputType;
  op.GetInputTypeCount = InputCount;
  op.GetOutputType = FloatType;
  op.GetOutputTypeCount = OneOutput;
  op.KernelDestroy = DestroyKernel;
  op.GetInputCharacteristic = Required;
  op.GetOutputCharacteristic = Required;
  op.GetInputMemoryType = DefaultMemory;
  op.GetVariadicInputMinArity = One;
  op.GetVariadicInputHomogeneity = Homogeneous;
  op.GetVariadicOutputMinArity = One;
  op.GetVariadicOutputHomogeneity = Homogeneous;
  op.CreateKernelV2 = CreateKernel;
  op.KernelComputeV2 = Compute;
  return op;
}

OrtCustomOp g_op = MakeOp();

// The operator's domain: one for the process, made on the first registration and shared by every session options
// after it (each keeps a pointer to it, so it lives as long as the process; a domain per registration would leak one
// per session a service creates).
OrtStatus* TheDomain(const OrtApi* api, OrtCustomOpDomain** out) {
  static std::mutex lock;
  static OrtCustomOpDomain* domain = nullptr;
  std::lock_guard<std::mutex> hold(lock);
  if (domain == nullptr) {
    OrtCustomOpDomain* made = nullptr;
    if (OrtStatus* s = api->CreateCustomOpDomain(kDomain, &made)) return s;
    if (OrtStatus* s = api->CustomOpDomain_Add(made, &g_op)) {
      api->ReleaseCustomOpDomain(made);
      return s;
    }
    domain = made;
  }
  *out = domain;
  return nullptr;
}

}  // namespace

extern "C" {

// The entry point ONNX Runtime calls on SessionOptions.register_custom_ops_library(path).
__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                 const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(kApiVersion);
  if (api == nullptr) return nullptr;  // a runtime older than the API asked for: no domain, the graph stays plain
  g_api = api;
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* s = TheDomain(api, &domain)) return s;
  return api->AddCustomOpDomain(options, domain);
}

// The float lanes of the kernel this CPU runs: 16 (AVX-512F), 8 (AVX2 + FMA) or 4 (generic, slower than ORT's
// GEMMs); fastnli fuses graphs only where it is at least 8.
__attribute__((visibility("default"))) int FastnliVectorWidth(void) { return g_isa.width; }

}  // extern "C"
