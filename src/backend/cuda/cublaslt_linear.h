// Dense linears through cuBLASLt: out[M, N] = x[M, K] W[N, K]^T (+ bias), bf16 operands, fp32 accumulation
// and scale, bf16 or f32 output, the bias in the epilogue for bf16 outputs. Row-major is handled as the
// column-major product out^T = W x^T ("TN": A = W transposed, B = x). The algorithm of each shape is chosen
// once by the heuristic and cached; the workspace is allocated once, so calls are graph-capturable.
// libcublasLt is opened (dlopen) when the first LtLinear is made, not linked: its static initializers cost
// ~0.5 CPU s in every process that links it, and most mxserve processes (the CPU backend, every CLI command
// and test process) never multiply on a GPU.
#pragma once

#include <cublasLt.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_check.h"

namespace mx::cuda {

inline Status cublas_status(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return internal_error(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(st)));
}

}  // namespace mx::cuda

#define MX_CUBLAS_RETURN_IF_ERROR(expr) MX_RETURN_IF_ERROR(::mx::cuda::cublas_status((expr), #expr))

namespace mx::cuda {

// Owners of cuBLASLt objects; they exist only once the library is open, so they are released through it.
void destroy_lt_handle(cublasLtHandle_t h);
void destroy_lt_matmul_desc(cublasLtMatmulDesc_t d);
void destroy_lt_layout(cublasLtMatrixLayout_t l);
void destroy_lt_preference(cublasLtMatmulPreference_t p);
using LtHandleOwner = Owned<cublasLtHandle_t, destroy_lt_handle>;
using LtMatmulDescOwner = Owned<cublasLtMatmulDesc_t, destroy_lt_matmul_desc>;
using LtLayoutOwner = Owned<cublasLtMatrixLayout_t, destroy_lt_layout>;
using LtPreferenceOwner = Owned<cublasLtMatmulPreference_t, destroy_lt_preference>;

class LtLinear {
 public:
  static Result<LtLinear> create(int64_t workspace_bytes);

  // out: f32 when `out_f32`, else bf16. bias may be null (then no epilogue). ldd: elements between out's rows
  // (0 = n; larger writes n columns of a wider matrix). `algo`: one of candidates()'s for this shape instead of
  // the heuristic's first (benchmarks).
  Status run(const void* x, const void* w, const void* bias, void* out, int64_t m, int64_t n, int64_t k, bool out_f32,
             cudaStream_t stream, int64_t ldd = 0, const cublasLtMatmulAlgo_t* algo = nullptr);

  // The heuristic's first `count` algorithms for a shape (ldd = n), its first (run()'s) first, each with its
  // configuration in words (tile, stages, split-k and its reduction, swizzle): benchmarks time them.
  struct Candidate {
    cublasLtMatmulAlgo_t algo{};
    std::string config;
  };
  Result<std::vector<Candidate>> candidates(int64_t m, int64_t n, int64_t k, bool out_f32, bool has_bias, int count);

 private:
  struct Plan {
    LtMatmulDescOwner desc;
    LtLayoutOwner a, b, d;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int64_t>;  // m, n, k, out_f32, has_bias, ldd
  Result<Plan*> plan(const Key& key);
  // Up to `count` of the heuristic's algorithms for a plan's shape, best guess first.
  Result<std::vector<cublasLtMatmulHeuristicResult_t>> heuristic(const Plan& p, int count);

  LtHandleOwner handle_;
  void* workspace_ = nullptr;
  int64_t workspace_bytes_ = 0;
  struct FreeDevice {
    void operator()(void* p) const { cudaFree(p); }
  };
  std::unique_ptr<void, FreeDevice> workspace_owner_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace mx::cuda
