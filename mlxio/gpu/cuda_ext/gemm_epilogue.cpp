// A GEMM whose cuBLASLt epilogue applies a ReLU and writes its sign bits, as an MLX primitive
// for MLX's CUDA build:
//
//   matmul_relu_aux(a [M, K], w [N, K]) -> [relu(a @ w^T) [M, N], bits [M, N / 8] uint8]
//
// T5's feed-forward is wo(relu(wi(x))): its wi GEMM writes relu(.) and the bits in one pass, in
// place of a GEMM and a ReLU kernel (`mlxcore.kernels.ffn_cuda`). The bits are cuBLASLt's
// (CUBLASLT_EPILOGUE_RELU_AUX): one per element of the column-major N x M result, i.e.
// row-major [M, N] with element 8 v + i in bit i of byte v, N a multiple of 128 - the layout of
// `mlxcore.kernels.relu_cuda`'s bits, whose backward kernel reads them. (cuBLASLt's DRELU epilogue for
// the backward GEMM was measured and dropped: on the H100 it runs as a separate 640 us kernel
// after the GEMM, against 138 us for relu_cuda's; benchmarks/results/h100/session13.)
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

// One cached cuBLASLt plan per (M, N, K, dtype): descriptors and the heuristic's
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

Plan& plan(int64_t m, int64_t n, int64_t k, mx::Dtype dtype, void* aux) {
  using Key = std::tuple<int64_t, int64_t, int64_t, int>;
  static std::map<Key, Plan> plans;
  Key key{m, n, k, int(cuda_type(dtype))};
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  Plan p;
  auto type = cuda_type(dtype);
  check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  // Row-major out [M, N] is column-major [N, M] = W' [N, K] x A' [K, M]: A' is a row-major
  // [M, K] read column-major (no transpose), W' the row-major [N, K] w read transposed.
  cublasOperation_t op_w = CUBLAS_OP_T;
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_w, sizeof(op_w)), "TRANSA");
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_RELU_AUX;
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), "EPILOGUE");
  int64_t aux_ld = n;
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)), "AUX_LD");
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)), "AUX_POINTER");
  check(cublasLtMatrixLayoutCreate(&p.w, type, k, n, k), "layout w");
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

class MatmulReluAux : public mx::Primitive {
 public:
  explicit MatmulReluAux(mx::Stream stream) : mx::Primitive(stream) {}

  void eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("[gemm_epilogue] runs on MLX's CUDA build only");
  }

  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& a = inputs[0];
    const mx::array& w = inputs[1];
    if (!a.flags().row_contiguous || !w.flags().row_contiguous) {
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
    void* aux = mx::gpu_ptr<void>(outputs[1]);
    for (auto& in : inputs) encoder.set_input_array(in);
    for (auto& out : outputs) encoder.set_output_array(out);
    std::lock_guard<std::mutex> lock(plans_mutex);
    Plan& p = plan(m, n, k, a.dtype(), aux);
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

  const char* name() const override { return "MatmulReluAux"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const MatmulReluAux*>(&other) != nullptr;
  }
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
                                std::make_shared<MatmulReluAux>(s),
                                {mx::contiguous(a, false, s), mx::contiguous(w, false, s)});
}

}  // namespace

NB_MODULE(_gemm_epilogue, m) {
  m.doc() = "A cuBLASLt GEMM with a ReLU epilogue as an MLX primitive (MLX's CUDA build)";
  m.def("matmul_relu_aux", &matmul_relu_aux, nb::arg("a"), nb::arg("w"),
        "[relu(a @ w.T), sign bits [M, N / 8] uint8] for a [M, K], w [N, K]");
}
