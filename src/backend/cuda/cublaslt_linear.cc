#include "backend/cuda/cublaslt_linear.h"

#include <string>

namespace mx::cuda {

Result<LtLinear> LtLinear::create(int64_t workspace_bytes) {
  LtLinear lt;
  cublasLtHandle_t h = nullptr;
  MX_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&h));
  lt.handle_ = LtHandle(h);
  void* ws = nullptr;
  MX_CUDA_RETURN_IF_ERROR(cudaMalloc(&ws, static_cast<size_t>(workspace_bytes)));
  lt.workspace_owner_.reset(ws);
  lt.workspace_ = ws;
  lt.workspace_bytes_ = workspace_bytes;
  return lt;
}

Result<LtLinear::Plan*> LtLinear::plan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  const auto [m, n, k, out_f32, has_bias, ldd] = key;
  auto p = std::make_unique<Plan>();
  cublasLtMatmulDesc_t desc = nullptr;
  MX_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  p->desc = LtMatmulDesc(desc);
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  MX_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  MX_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (has_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    MX_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    const cudaDataType_t bias_type = CUDA_R_16BF;
    MX_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  const cudaDataType_t out_type = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  // Column-major views: A = W as [k, n] (ld k), B = x^T as [k, m] (ld k), D = out^T as [n, m] (ld n).
  MX_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, n, k));
  p->a = LtLayout(a);
  MX_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, m, k));
  p->b = LtLayout(b);
  MX_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d, out_type, n, m, ldd));
  p->d = LtLayout(d);
  cublasLtMatmulPreference_t pref = nullptr;
  MX_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  LtPreference pref_owner(pref);
  const uint64_t ws = static_cast<uint64_t>(workspace_bytes_);
  MX_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  MX_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulAlgoGetHeuristic(handle_.get(), desc, a, b, d, d, pref, 1, &result, &found));
  if (found == 0)
    return unimplemented("cuBLASLt has no algorithm for " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                         std::to_string(k));
  p->algo = result.algo;
  Plan* raw = p.get();
  plans_.emplace(key, std::move(p));
  return raw;
}

Status LtLinear::run(const void* x, const void* w, const void* bias, void* out, int64_t m, int64_t n, int64_t k,
                     bool out_f32, cudaStream_t stream, int64_t ldd) {
  MX_ASSIGN_OR_RETURN(Plan * p, plan(Key{m, n, k, out_f32, bias != nullptr, ldd > 0 ? ldd : n}));
  if (bias)
    MX_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p->desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                             sizeof(bias)));
  const float alpha = 1.0f, beta = 0.0f;
  MX_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_.get(), p->desc.get(), &alpha, w, p->a.get(), x, p->b.get(), &beta,
                                           out, p->d.get(), out, p->d.get(), &p->algo, workspace_,
                                           static_cast<size_t>(workspace_bytes_), stream));
  return Status::ok();
}

}  // namespace mx::cuda
