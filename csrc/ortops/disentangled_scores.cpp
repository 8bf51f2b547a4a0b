// fastnli's ONNX Runtime custom operator library (CPU): DeBERTa v1's attention, content and both position terms, from
// the projections to the probabilities in one pass.
//
// Operator ``ai.fastnli::DisentangledScores`` (version 1), float32:
//   inputs   q      (..., L, d)    the scaled queries
//            kT     (..., d, L)    the keys, transposed
//            pkT    (..., d, 2L)   the position keys, transposed (the relative shift's 2L positions)
//            pqT    (..., d, 2L)   the scaled position queries, transposed
//            masked (..., L|1, L)  optional, bool: the positions the softmax leaves out
//            fill   ()             optional (with masked): the score a left-out position gets (the graph's float min)
//   output   (..., L, L)           scores[i, j] = q_i . k_j + q_i . pk[L - 1 - i + j] + k_j . pq[L - j + i]; with
//                                  masked: softmax over j of where(masked, fill, scores), the attention probabilities
// pkT, pqT and masked's leading dimensions are q's or broadcast to them (the exported graph's (1, heads) and
// (batch, 1)). The (batch x head) blocks are shared out over the session's intra-op thread pool. It replaces, per
// layer, the exported graph's three fp32 MatMuls (q.kT, q.pkT, k.pqT: the last two (..., L, 2L) wide), the bands'
// Reshape -> Slice -> Reshape -> Slice chains, the Transpose, the two Adds, the mask's Where and the Softmax
// (fastnli/exporter/attention.py writes them; fastnli/engine/fused_attention.py rewrites them): each score is three
// fused multiply-adds per k along the band, 3 L^2 d per block instead of 5 L^2 d, no (..., L, 2L) tensor is written,
// and each row's softmax runs while the row is in L1. The sums run in another order than the graph's, so results
// differ from it by float rounding (relative 1e-6).
//
// Kernels for AVX-512F and AVX2+FMA are chosen at run time (GCC on x86-64; FASTNLI_OPERATOR_ISA=avx2 or generic
// caps the choice); elsewhere a 4-lane generic kernel runs, slower than ORT's own GEMMs, and FastnliVectorWidth()
// says so to fastnli, which then leaves the graph plain.
//
// Built against ONNX Runtime's C API header only (include/, MIT, from the onnxruntime 1.29 headers); it asks the
// runtime for API version 17 (onnxruntime >= 1.17, for KernelContext_ParallelFor), so any later runtime loads it.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "onnxruntime_c_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FASTNLI_X86_KERNELS 1
#include <immintrin.h>
#endif

namespace {

// One (batch, head) block for a kernel (scores_kernel.inc): the operands as that file describes them, and the mask
// (null: scores only) with the stride of its rows (0: one row for all) and the fill value.
struct HeadArgs {
  const float* q;
  const float* kT;
  const float* pk;
  const float* pr;
  float* out;
  int64_t L, d, Lp, Pp;
  const bool* masked;
  int64_t mask_row_stride;
  float fill;
};

inline float ExpScalar(float x) { return std::exp(x); }

// e^x for x <= 0 (a softmax's shifted scores): 2^n p(r), Cephes' degree-6 polynomial on r = x - n ln 2; 0 below
// -87.3, where 2^n would leave the normal floats.
constexpr float kExpLow = -87.33654f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2High = 0.693359375f;
constexpr float kLn2Low = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

#ifdef FASTNLI_X86_KERNELS
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
namespace avx512 {
typedef __m512 V;
constexpr int W = 16, kRows = 4, kCols = 2;
inline V Zero() { return _mm512_setzero_ps(); }
inline V Load(const float* p) { return _mm512_loadu_ps(p); }
inline void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V Splat(float s) { return _mm512_set1_ps(s); }
inline V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V Max(V a, V b) { return _mm512_max_ps(a, b); }
inline float ReduceMax(V v) { return _mm512_reduce_max_ps(v); }
inline float ReduceAdd(V v) { return _mm512_reduce_add_ps(v); }
inline V Exp(V x) {
  const V low = Splat(kExpLow);
  const V xc = _mm512_max_ps(x, low);
  const V n = _mm512_roundscale_ps(xc * Splat(kLog2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const V r = _mm512_fnmadd_ps(n, Splat(kLn2Low), _mm512_fnmadd_ps(n, Splat(kLn2High), xc));
  V p = Splat(kExpPoly[0]);
  for (int k = 1; k < 6; ++k) p = Fma(p, r, Splat(kExpPoly[k]));
  p = Fma(p, r * r, r + Splat(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, low, _CMP_GE_OQ), p * _mm512_castsi512_ps(e));
}
#include "scores_kernel.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
typedef __m256 V;
constexpr int W = 8, kRows = 4, kCols = 2;
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
inline V Exp(V x) {
  const V low = Splat(kExpLow);
  const V xc = _mm256_max_ps(x, low);
  const V n = _mm256_round_ps(xc * Splat(kLog2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const V r = _mm256_fnmadd_ps(n, Splat(kLn2Low), _mm256_fnmadd_ps(n, Splat(kLn2High), xc));
  V p = Splat(kExpPoly[0]);
  for (int k = 1; k < 6; ++k) p = Fma(p, r, Splat(kExpPoly[k]));
  p = Fma(p, r * r, r + Splat(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_cmp_ps(x, low, _CMP_GE_OQ), p * _mm256_castsi256_ps(e));
}
#include "scores_kernel.inc"
}  // namespace avx2
#pragma GCC pop_options
#endif

namespace generic {
typedef float V __attribute__((vector_size(16)));
constexpr int W = 4, kRows = 4, kCols = 2;
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
inline V Exp(V x) { return V{ExpScalar(x[0]), ExpScalar(x[1]), ExpScalar(x[2]), ExpScalar(x[3])}; }
#include "scores_kernel.inc"
}  // namespace generic

typedef void (*HeadFn)(const HeadArgs&);

struct Isa {
  int width;
  HeadFn head;
};

// The widest kernel this CPU runs, or a narrower one named by FASTNLI_OPERATOR_ISA (avx2 or generic: for tests and
// for CPUs that slow their clock under AVX-512).
Isa Pick() {
  const char* asked = std::getenv("FASTNLI_OPERATOR_ISA");
  const std::string cap = asked == nullptr ? "" : asked;
#ifdef FASTNLI_X86_KERNELS
  __builtin_cpu_init();
  if (cap != "avx2" && cap != "generic" && __builtin_cpu_supports("avx512f")) return {avx512::W, avx512::Head};
  if (cap != "generic" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return {avx2::W, avx2::Head};
  }
#endif
  return {generic::W, generic::Head};
}

const Isa g_isa = Pick();

constexpr uint32_t kApiVersion = 17;
const char* const kDomain = "ai.fastnli";
const char* const kOpName = "DisentangledScores";
constexpr size_t kInputs = 6, kRequired = 4;  // q, kT, pkT, pqT; masked and fill optional

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

// For an input whose leading dimensions ``lead`` broadcast to q's (``q_lead``, numpy's rules: aligned from the
// right, each 1 or q's), the stride in the input's blocks of each of q's leading dimensions (0 where broadcast);
// false where they do not broadcast.
bool BlockStrides(const std::vector<int64_t>& lead, const std::vector<int64_t>& q_lead, std::vector<int64_t>* strides) {
  if (lead.size() > q_lead.size()) return false;
  strides->assign(q_lead.size(), 0);
  int64_t stride = 1;
  for (size_t a = lead.size(); a-- > 0;) {
    const size_t qa = q_lead.size() - lead.size() + a;
    if (lead[a] != 1 && lead[a] != q_lead[qa]) return false;
    if (lead[a] != 1) (*strides)[qa] = stride;
    stride *= lead[a];
  }
  return true;
}

// The input's block that q's block ``n`` reads.
int64_t BlockOf(int64_t n, const std::vector<int64_t>& q_lead, const std::vector<int64_t>& strides) {
  int64_t block = 0;
  for (size_t a = q_lead.size(); a-- > 0;) {
    block += (n % q_lead[a]) * strides[a];
    n /= q_lead[a];
  }
  return block;
}

// One call's operands, shared by the thread pool's workers.
struct Blocks {
  const float* q;
  const float* kT;
  const float* pk;  // the padded position keys, (position blocks, d, Pp)
  const float* pr;  // the padded, reversed position queries, (position blocks, d, Pp)
  float* out;
  int64_t L, d, Lp, Pp;
  std::vector<int64_t> lead, position_strides, mask_strides;
  const bool* masked;  // null: scores only
  int64_t mask_rows;   // L or 1
  float fill;
  HeadFn head;
};

// Block n of the (batch x head) blocks: its keys copied into this thread's zero-padded scratch, then the kernel.
void RunBlock(void* data, size_t index) {
  const Blocks& b = *static_cast<const Blocks*>(data);
  const int64_t n = static_cast<int64_t>(index), L = b.L, d = b.d, Lp = b.Lp, Pp = b.Pp;
  thread_local std::vector<float> keys;
  keys.assign(d * Lp, 0.0f);
  const float* kb = b.kT + n * d * L;
  for (int64_t k = 0; k < d; ++k) std::copy(kb + k * L, kb + (k + 1) * L, keys.begin() + k * Lp);
  const int64_t p = BlockOf(n, b.lead, b.position_strides);
  HeadArgs args{b.q + n * L * d, keys.data(), b.pk + p * d * Pp, b.pr + p * d * Pp, b.out + n * L * L, L, d, Lp, Pp,
                nullptr, b.mask_rows == 1 ? 0 : L, b.fill};
  if (b.masked != nullptr) args.masked = b.masked + BlockOf(n, b.lead, b.mask_strides) * b.mask_rows * L;
  b.head(args);
}

OrtStatus* ORT_API_CALL Compute(void*, OrtKernelContext* context) {
  const OrtValue* inputs[kInputs] = {};
  std::vector<int64_t> dims[kInputs];
  size_t given = 0;
  if (OrtStatus* s = g_api->KernelContext_GetInputCount(context, &given)) return s;
  for (size_t k = 0; k < kInputs && k < given; ++k) {
    if (OrtStatus* s = g_api->KernelContext_GetInput(context, k, &inputs[k])) return s;
    if (inputs[k] != nullptr) {
      if (OrtStatus* s = Shape(inputs[k], &dims[k])) return s;
    }
  }
  for (size_t k = 0; k < kRequired; ++k) {
    if (inputs[k] == nullptr) return Fail("input " + std::to_string(k) + " is missing");
  }
  if ((inputs[4] == nullptr) != (inputs[5] == nullptr)) return Fail("masked and fill come together or not at all");
  const std::vector<int64_t>& q = dims[0];
  if (q.size() < 2) return Fail("q must be (..., L, d)");
  const int64_t L = q[q.size() - 2], d = q.back();
  Blocks work{};
  work.lead.assign(q.begin(), q.end() - 2);
  std::vector<int64_t> kt(work.lead);
  kt.push_back(d);
  kt.push_back(L);
  if (dims[1] != kt) return Fail("kT must be (..., d, L) with q's leading dimensions");
  const char* const positions_error = "pkT and pqT must be (..., d, 2L), their leading dimensions q's or broadcast "
                                      "to them, and alike";
  if (dims[2] != dims[3]) return Fail(positions_error);
  const std::vector<int64_t>& pos = dims[2];
  if (pos.size() < 2 || pos[pos.size() - 2] != d || pos.back() != 2 * L ||
      !BlockStrides(std::vector<int64_t>(pos.begin(), pos.end() - 2), work.lead, &work.position_strides)) {
    return Fail(positions_error);
  }
  if (inputs[4] != nullptr) {
    const std::vector<int64_t>& m = dims[4];
    if (m.size() < 2 || m.back() != L || (m[m.size() - 2] != L && m[m.size() - 2] != 1) ||
        !BlockStrides(std::vector<int64_t>(m.begin(), m.end() - 2), work.lead, &work.mask_strides)) {
      return Fail("masked must be (..., L or 1, L), its leading dimensions q's or broadcast to them");
    }
    size_t fill_size = 0;
    OrtTensorTypeAndShapeInfo* info = nullptr;
    if (OrtStatus* s = g_api->GetTensorTypeAndShape(inputs[5], &info)) return s;
    OrtStatus* s = g_api->GetTensorShapeElementCount(info, &fill_size);
    g_api->ReleaseTensorTypeAndShapeInfo(info);
    if (s != nullptr) return s;
    if (fill_size != 1) return Fail("fill must be one value");
  }
  std::vector<int64_t> out_dims(work.lead);
  out_dims.push_back(L);
  out_dims.push_back(L);
  OrtValue* output = nullptr;
  if (OrtStatus* s = g_api->KernelContext_GetOutput(context, 0, out_dims.data(), out_dims.size(), &output)) return s;
  void* data[kInputs] = {};
  for (size_t k = 0; k < kInputs; ++k) {
    if (inputs[k] == nullptr) continue;
    if (OrtStatus* s = g_api->GetTensorMutableData(const_cast<OrtValue*>(inputs[k]), &data[k])) return s;
  }
  void* out = nullptr;
  if (OrtStatus* s = g_api->GetTensorMutableData(output, &out)) return s;
  int64_t blocks = 1;
  for (int64_t n : work.lead) blocks *= n;
  if (blocks == 0 || L == 0) return nullptr;

  // The position inputs, padded by one vector and (the queries) reversed along the positions, once per call.
  const int64_t W = g_isa.width, Lp = (L + W - 1) / W * W, P = 2 * L, Pp = P + W;
  int64_t position_blocks = 1;
  for (size_t a = 0; a + 2 < pos.size(); ++a) position_blocks *= pos[a];
  std::vector<float> pk(position_blocks * d * Pp, 0.0f), pr(position_blocks * d * Pp, 0.0f);
  const float* pkt = static_cast<const float*>(data[2]);
  const float* pqt = static_cast<const float*>(data[3]);
  for (int64_t row = 0; row < position_blocks * d; ++row) {
    std::copy(pkt + row * P, pkt + (row + 1) * P, pk.begin() + row * Pp);
    std::reverse_copy(pqt + row * P, pqt + (row + 1) * P, pr.begin() + row * Pp);
  }
  work.q = static_cast<const float*>(data[0]);
  work.kT = static_cast<const float*>(data[1]);
  work.pk = pk.data();
  work.pr = pr.data();
  work.out = static_cast<float*>(out);
  work.L = L;
  work.d = d;
  work.Lp = Lp;
  work.Pp = Pp;
  work.head = g_isa.head;
  if (inputs[4] != nullptr) {
    work.masked = static_cast<const bool*>(data[4]);
    work.mask_rows = dims[4][dims[4].size() - 2];
    work.fill = *static_cast<const float*>(data[5]);
  }
  return g_api->KernelContext_ParallelFor(context, RunBlock, static_cast<size_t>(blocks), 0, &work);
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
  return index == 4 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
ONNXTensorElementDataType ORT_API_CALL FloatType(const OrtCustomOp*, size_t) {
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
size_t ORT_API_CALL InputCount(const OrtCustomOp*) { return kInputs; }
size_t ORT_API_CALL OneOutput(const OrtCustomOp*) { return 1; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL InputCharacteristic(const OrtCustomOp*, size_t index) {
  return index < kRequired ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}
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
  op.GetInputCharacteristic = InputCharacteristic;
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

}  // namespace

extern "C" {

// The entry point ONNX Runtime calls on SessionOptions.register_custom_ops_library(path).
__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                 const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(kApiVersion);
  if (api == nullptr) return nullptr;  // a runtime older than the API asked for: no domain, the graph stays plain
  g_api = api;
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* s = api->CreateCustomOpDomain(kDomain, &domain)) return s;
  if (OrtStatus* s = api->CustomOpDomain_Add(domain, &g_op)) return s;
  return api->AddCustomOpDomain(options, domain);  // the domain lives as long as the process (ORT's own examples)
}

// The float lanes of the kernel this CPU runs: 16 (AVX-512F), 8 (AVX2 + FMA) or 4 (generic, slower than ORT's
// GEMMs); fastnli fuses graphs only where it is at least 8.
__attribute__((visibility("default"))) int FastnliVectorWidth(void) { return g_isa.width; }

}  // extern "C"
