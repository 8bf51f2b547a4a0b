// fastnli's ONNX Runtime custom operator library (CPU): DeBERTa v1's attention scores with the relative shift in
// one pass.
//
// Operator ``ai.fastnli::RelativeScores`` (version 1), float32:
//   inputs   qk  (..., L, L)   the content scores (scaled queries . keys)
//            c2p (..., L, 2L)  queries . the position keys, reversed (row i reads column L - 1 - i + j)
//            p2c (..., L, 2L)  keys . the position queries (row j reads column L - j + i, transposed)
//   output   (..., L, L)       out[i, j] = qk[i, j] + (c2p[i, L - 1 - i + j] + p2c[j, L - j + i])
//   attribute threads (int, default 1): threads that share the leading (batch x head) blocks.
// It replaces the two bands' Reshape -> Slice -> Reshape -> Slice chains, the Transpose and the two Adds of the
// exported graph (fastnli/exporter/attention.py writes the bands; fastnli/engine/fused_attention.py rewrites them),
// which copy the (..., L, 2L) products several times; here every product is read once, in cache-sized tiles.
//
// Built against ONNX Runtime's C API header only (include/, MIT, from the onnxruntime 1.29 headers); it asks the
// runtime for API version 16 (onnxruntime >= 1.16), so any later runtime loads it.

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "onnxruntime_c_api.h"

namespace {

constexpr uint32_t kApiVersion = 16;
constexpr int64_t kTile = 32;
const char* const kDomain = "ai.fastnli";
const char* const kOpName = "RelativeScores";

const OrtApi* g_api = nullptr;

// One (L, L) block: out = qk + (band(c2p) + band(p2c)^T), in kTile x kTile tiles so that the transposed band's rows
// stay in L1.
void ScoresBlock(const float* qk, const float* c2p, const float* p2c, float* out, int64_t L) {
  const int64_t W = 2 * L;
  for (int64_t i0 = 0; i0 < L; i0 += kTile) {
    const int64_t i1 = std::min(i0 + kTile, L);
    for (int64_t j0 = 0; j0 < L; j0 += kTile) {
      const int64_t j1 = std::min(j0 + kTile, L);
      for (int64_t i = i0; i < i1; ++i) {
        const float* a = c2p + i * W + (L - 1 - i);  // a[j] = c2p[i, L - 1 - i + j]
        float* o = out + i * L;
        for (int64_t j = j0; j < j1; ++j) o[j] = a[j];
      }
      for (int64_t j = j0; j < j1; ++j) {
        const float* b = p2c + j * W + (L - j);  // b[i] = p2c[j, L - j + i]
        for (int64_t i = i0; i < i1; ++i) out[i * L + j] += b[i];
      }
      for (int64_t i = i0; i < i1; ++i) {  // qk + (c2p + p2c): the exported graph's order, so the sums are its bits
        const float* q = qk + i * L;
        float* o = out + i * L;
        for (int64_t j = j0; j < j1; ++j) o[j] = q[j] + o[j];
      }
    }
  }
}

struct Kernel {
  int64_t threads = 1;
};

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

OrtStatus* ORT_API_CALL Compute(void* op_kernel, OrtKernelContext* context) {
  const Kernel* kernel = static_cast<const Kernel*>(op_kernel);
  const OrtValue* inputs[3] = {nullptr, nullptr, nullptr};
  std::vector<int64_t> dims[3];
  for (size_t k = 0; k < 3; ++k) {
    if (OrtStatus* s = g_api->KernelContext_GetInput(context, k, &inputs[k])) return s;
    if (inputs[k] == nullptr) return Fail("input " + std::to_string(k) + " is missing");
    if (OrtStatus* s = Shape(inputs[k], &dims[k])) return s;
  }
  const std::vector<int64_t>& qk = dims[0];
  if (qk.size() < 2 || qk[qk.size() - 1] != qk[qk.size() - 2]) return Fail("qk must be (..., L, L)");
  const int64_t L = qk.back();
  int64_t blocks = 1;
  for (size_t d = 0; d + 2 < qk.size(); ++d) blocks *= qk[d];
  for (size_t k = 1; k < 3; ++k) {
    std::vector<int64_t> want(qk);
    want.back() = 2 * L;
    if (dims[k] != want) return Fail("c2p and p2c must be (..., L, 2L) with qk's leading dimensions");
  }
  OrtValue* output = nullptr;
  if (OrtStatus* s = g_api->KernelContext_GetOutput(context, 0, qk.data(), qk.size(), &output)) return s;
  void* data[4] = {nullptr, nullptr, nullptr, nullptr};
  for (size_t k = 0; k < 3; ++k) {
    if (OrtStatus* s = g_api->GetTensorMutableData(const_cast<OrtValue*>(inputs[k]), &data[k])) return s;
  }
  if (OrtStatus* s = g_api->GetTensorMutableData(output, &data[3])) return s;
  if (blocks == 0 || L == 0) return nullptr;
  const float* q = static_cast<const float*>(data[0]);
  const float* a = static_cast<const float*>(data[1]);
  const float* b = static_cast<const float*>(data[2]);
  float* o = static_cast<float*>(data[3]);
  const int64_t LL = L * L, LW = 2 * L * L;
  auto run = [=](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) ScoresBlock(q + n * LL, a + n * LW, b + n * LW, o + n * LL, L);
  };
  const int64_t workers = std::max<int64_t>(1, std::min(kernel->threads, blocks));
  if (workers == 1) {
    run(0, blocks);
    return nullptr;
  }
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(run, blocks * w / workers, blocks * (w + 1) / workers);
  run(0, blocks / workers);
  for (std::thread& t : pool) t.join();
  return nullptr;
}

OrtStatus* ORT_API_CALL CreateKernel(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info,
                                     void** kernel) {
  Kernel* k = new Kernel();
  int64_t threads = 1;
  if (OrtStatus* s = api->KernelInfoGetAttribute_int64(info, "threads", &threads)) {
    api->ReleaseStatus(s);  // absent: one thread
    threads = 1;
  }
  k->threads = std::max<int64_t>(1, threads);
  *kernel = k;
  return nullptr;
}

void ORT_API_CALL DestroyKernel(void* kernel) { delete static_cast<Kernel*>(kernel); }
const char* ORT_API_CALL Name(const OrtCustomOp*) { return kOpName; }
const char* ORT_API_CALL Provider(const OrtCustomOp*) { return "CPUExecutionProvider"; }
ONNXTensorElementDataType ORT_API_CALL FloatType(const OrtCustomOp*, size_t) {
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
size_t ORT_API_CALL ThreeInputs(const OrtCustomOp*) { return 3; }
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
  op.GetInputType = FloatType;
  op.GetInputTypeCount = ThreeInputs;
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

}  // extern "C"
