// GEMMs whose cuBLASLt epilogue applies a ReLU (writing its sign bits) or the ReLU's gradient
// (reading them), as MLX primitives for MLX's CUDA build.
//
//   matmul_relu_aux(a [M, K], w [N, K]) -> [relu(a @ w^T) [M, N], bits [M, N / 8] uint8]
//   matmul_drelu(g [M, K], w [K, N], bits) -> (g @ w) * (bits set) [M, N]
//
// T5's feed-forward is wo(relu(wi(x))): the forward's wi GEMM writes relu(.) and the bits in one
// pass, and the backward's g @ wo GEMM writes the pre-activation gradient directly, so neither
// ReLU pass exists (`mlxcore.ffn_cuda` pairs them under an mx.custom_function). The bits are
// cuBLASLt's (CUBLASLT_EPILOGUE_RELU_AUX): one per element of the column-major N x M result,
// i.e. row-major [M, N] with 8 per byte, N a multiple of 128.
//
// Only MLX's exported CUDA API is used: the stream's command encoder (inputs, outputs, graph
// capture) and its allocator. Outputs and workspace come from `allocator::malloc`.
#include <cublasLt.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "mlx/array.h"
#include "mlx/backend/cuda/device.h"
#include "mlx/backend/cuda/utils.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/stream.h"

namespace mx = mlx::core;
namespace nb = nanobind;

namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(
        std::string("[gemm_epilogue] ") + what + " failed: cublasStatus " + std::to_string(int(status)));
  }
}

cudaDataType_t cuda_type(mx::Dtype dtype) {
  if (dtype == mx::bfloat16) return CUDA_R_16BF;
  if (dtype == mx::float16) return CUDA_R_16F;
  if (dtype == mx::float32) return CUDA_R_32F;
  throw std::invalid_argument("[gemm_epilogue] needs bfloat16, float16 or float32 inputs");
}

// One cached cuBLASLt plan per (M, N, K, dtype, epilogue): descriptors and the heuristic's
// algorithm. Only the aux pointer changes between calls.
struct Plan {
  cublasLtMatmulDesc_t desc{nullptr};
  cublasLtMatrixLayout_t w{nullptr}, a{nullptr}, d{nullptr};
  cublasLtMatmulAlgo_t algo;
  size_t workspace{0};
};

constexpr size_t kMaxWorkspace = 32 << 20;  // MLX's choice on Hopper

cublasLtHandle_t handle() {
  static cublasLtHandle_t h = [] {
    cublasLtHandle_t x;
    check(cublasLtCreate(&x), "cublasLtCreate");
    return x;
  }();
  return h;
}

std::mutex plans_mutex;

Plan& plan(int64_t m, int64_t n, int64_t k, mx::Dtype dtype, bool drelu, bool w_t, void* aux) {
  using Key = std::tuple<int64_t, int64_t, int64_t, int, bool, bool>;
  static std::map<Key, Plan> plans;
  Key key{m, n, k, int(cuda_type(dtype)), drelu, w_t};
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  Plan p;
  auto type = cuda_type(dtype);
  check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  // Row-major out [M, N] is column-major [N, M] = W' [N, K] x A' [K, M], where A' is a row-major
  // [M, K] read column-major (no transpose) and W' is w: row-major [N, K] (forward, read
  // transposed) or [K, N] (backward, not).
  cublasOperation_t op_w = w_t ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_w, sizeof(op_w)), "TRANSA");
  cublasLtEpilogue_t epilogue = drelu ? CUBLASLT_EPILOGUE_DRELU : CUBLASLT_EPILOGUE_RELU_AUX;
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), "EPILOGUE");
  int64_t aux_ld = n;
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)), "AUX_LD");
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)), "AUX_POINTER");
  if (w_t) {
    check(cublasLtMatrixLayoutCreate(&p.w, type, k, n, k), "layout w");
  } else {
    check(cublasLtMatrixLayoutCreate(&p.w, type, n, k, n), "layout w");
  }
  check(cublasLtMatrixLayoutCreate(&p.a, type, k, m, k), "layout a");
  check(cublasLtMatrixLayoutCreate(&p.d, type, n, m, n), "layout d");
  cublasLtMatmulPreference_t pref;
  check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  size_t max_ws = kMaxWorkspace;
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws)),
        "PREF_MAX_WORKSPACE_BYTES");
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  check(cublasLtMatmulAlgoGetHeuristic(handle(), p.desc, p.w, p.a, p.d, p.d, pref, 1, &result, &found),
        "AlgoGetHeuristic");
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0) {
    throw std::runtime_error("[gemm_epilogue] cuBLASLt has no algorithm for this GEMM and epilogue");
  }
  p.algo = result.algo;
  p.workspace = result.workspaceSize;
  return plans.emplace(key, p).first->second;
}

class EpilogueMatmul : public mx::Primitive {
 public:
  EpilogueMatmul(mx::Stream stream, bool drelu, bool w_t) : mx::Primitive(stream), drelu_(drelu), w_t_(w_t) {}

  void eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("[gemm_epilogue] runs on MLX's CUDA build only");
  }

  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& a = inputs[0];
    const mx::array& w = inputs[1];
    if (!a.flags().row_contiguous || !w.flags().row_contiguous ||
        (drelu_ && !inputs[2].flags().row_contiguous)) {
      throw std::runtime_error("[gemm_epilogue] inputs must be row-contiguous");
    }
    for (auto& in : inputs) {
      if (reinterpret_cast<uintptr_t>(mx::gpu_ptr<void>(in)) % 16 != 0) {
        throw std::runtime_error("[gemm_epilogue] inputs must be 16-byte aligned (a sliced view is not)");
      }
    }
    auto& encoder = mx::cu::get_command_encoder(stream());
    int64_t m = a.shape(0), k = a.shape(1), n = outputs[0].shape(1);
    for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
    void* aux = drelu_ ? mx::gpu_ptr<void>(inputs[2]) : mx::gpu_ptr<void>(outputs[1]);
    for (auto& in : inputs) encoder.set_input_array(in);
    for (auto& out : outputs) encoder.set_output_array(out);
    std::lock_guard<std::mutex> lock(plans_mutex);
    Plan& p = plan(m, n, k, a.dtype(), drelu_, w_t_, aux);
    check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)),
          "AUX_POINTER");
    void* workspace = nullptr;
    if (p.workspace > 0) {
      // at least a page: MLX serves a few bytes from a pool with 8-byte alignment, and
      // cuBLASLt wants its workspace 256-byte aligned
      int bytes = int(std::max<size_t>(p.workspace, 4096));
      mx::array ws({bytes}, mx::uint8, nullptr, {});
      ws.set_data(mx::allocator::malloc(bytes));
      encoder.add_temporary(ws);
      workspace = mx::gpu_ptr<void>(ws);
    }
    float alpha = 1.0f, beta = 0.0f;
    void* out = mx::gpu_ptr<void>(outputs[0]);
    auto capture = encoder.capture_context();
    check(cublasLtMatmul(handle(), p.desc, &alpha, mx::gpu_ptr<void>(w), p.w, mx::gpu_ptr<void>(a), p.a, &beta,
                         out, p.d, out, p.d, &p.algo, workspace, p.workspace, encoder.stream()),
          "cublasLtMatmul");
  }

  const char* name() const override { return drelu_ ? "MatmulDrelu" : "MatmulReluAux"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const EpilogueMatmul*>(&other);
    return o != nullptr && o->drelu_ == drelu_ && o->w_t_ == w_t_;
  }

 private:
  bool drelu_;
  bool w_t_;  // w is [N, K] (the product is a @ w^T), else [K, N]
};

void check_args(const mx::array& a, const mx::array& w, int64_t k, int64_t n, const char* fn) {
  if (a.ndim() != 2 || w.ndim() != 2) throw std::invalid_argument(std::string(fn) + ": a and w must be 2-D");
  if (a.dtype() != w.dtype()) throw std::invalid_argument(std::string(fn) + ": a and w must share a dtype");
  cuda_type(a.dtype());
  if (a.shape(1) != k) throw std::invalid_argument(std::string(fn) + ": a's columns must match w");
  if (n % 128 != 0) throw std::invalid_argument(std::string(fn) + ": the output's columns must be a multiple of 128");
}

std::vector<mx::array> matmul_relu_aux(const mx::array& a, const mx::array& w) {
  check_args(a, w, w.shape(1), w.shape(0), "matmul_relu_aux");
  int m = a.shape(0), n = w.shape(0);
  auto s = mx::default_stream(mx::default_device());
  return mx::array::make_arrays({{m, n}, {m, n / 8}}, {a.dtype(), mx::uint8},
                                std::make_shared<EpilogueMatmul>(s, false, true),
                                {mx::contiguous(a, false, s), mx::contiguous(w, false, s)});
}

mx::array matmul_drelu(const mx::array& g, const mx::array& w, const mx::array& bits, bool transposed) {
  int64_t k = transposed ? w.shape(1) : w.shape(0), n = transposed ? w.shape(0) : w.shape(1);
  check_args(g, w, k, n, "matmul_drelu");
  int m = g.shape(0);
  if (bits.dtype() != mx::uint8 || bits.ndim() != 2 || bits.shape(0) != m || bits.shape(1) != n / 8) {
    throw std::invalid_argument("matmul_drelu: bits must be uint8 [M, N / 8] from matmul_relu_aux");
  }
  auto s = mx::default_stream(mx::default_device());
  return mx::array({m, n}, g.dtype(), std::make_shared<EpilogueMatmul>(s, true, transposed),
                   {mx::contiguous(g, false, s), mx::contiguous(w, false, s), mx::contiguous(bits, false, s)});
}

}  // namespace

NB_MODULE(_gemm_epilogue, m) {
  m.doc() = "cuBLASLt GEMMs with ReLU epilogues as MLX primitives (MLX's CUDA build)";
  m.def("matmul_relu_aux", &matmul_relu_aux, nb::arg("a"), nb::arg("w"),
        "[relu(a @ w.T), sign bits [M, N / 8] uint8] for a [M, K], w [N, K]");
  m.def("matmul_drelu", &matmul_drelu, nb::arg("g"), nb::arg("w"), nb::arg("bits"), nb::arg("transposed") = false,
        "(g @ w) * (bits set) for g [M, K], w [K, N] (transposed: g @ w.T, w [N, K]) and matmul_relu_aux's bits");
}
