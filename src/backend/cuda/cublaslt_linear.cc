#include "backend/cuda/cublaslt_linear.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

namespace mx::cuda {
namespace {

// The cuBLASLt entry points mxserve uses, from the library found at run time: on the library path
// (LD_LIBRARY_PATH, the loader's cache) or else in the toolkit folder this binary was built against, where
// linking it used to find it (the build tree's RUNPATH).
struct CublasLtLibrary {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set_attribute = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set_attribute = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulAlgoConfigGetAttribute) algo_config_get = nullptr;

  static Result<const CublasLtLibrary*> get() {
    static const Result<CublasLtLibrary> lib = load();
    if (!lib.is_ok()) return lib.status();
    return &*lib;
  }
  // For releasing objects, which exist only once get() has succeeded.
  static const CublasLtLibrary& opened() { return **get(); }

 private:
  static Result<CublasLtLibrary> load() {
    const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) handle = dlopen((std::string(MX_CUDA_LIBRARY_DIR) + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle)
      return unimplemented("dense linears on CUDA need cuBLASLt (" + name + " on the library path or in " +
                           MX_CUDA_LIBRARY_DIR + "): " + dlerror());
    CublasLtLibrary l;
    bool found_all = true;
    auto sym = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, symbol));
      found_all = found_all && fn != nullptr;
    };
    sym(l.create, "cublasLtCreate");
    sym(l.destroy, "cublasLtDestroy");
    sym(l.matmul, "cublasLtMatmul");
    sym(l.algo_get_heuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(l.desc_create, "cublasLtMatmulDescCreate");
    sym(l.desc_destroy, "cublasLtMatmulDescDestroy");
    sym(l.desc_set_attribute, "cublasLtMatmulDescSetAttribute");
    sym(l.pref_create, "cublasLtMatmulPreferenceCreate");
    sym(l.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    sym(l.pref_set_attribute, "cublasLtMatmulPreferenceSetAttribute");
    sym(l.layout_create, "cublasLtMatrixLayoutCreate");
    sym(l.layout_destroy, "cublasLtMatrixLayoutDestroy");
    sym(l.algo_config_get, "cublasLtMatmulAlgoConfigGetAttribute");
    if (!found_all) return unimplemented(name + " lacks entry points mxserve needs");
    return l;
  }
};

}  // namespace

void destroy_lt_handle(cublasLtHandle_t h) { CublasLtLibrary::opened().destroy(h); }
void destroy_lt_matmul_desc(cublasLtMatmulDesc_t d) { CublasLtLibrary::opened().desc_destroy(d); }
void destroy_lt_layout(cublasLtMatrixLayout_t l) { CublasLtLibrary::opened().layout_destroy(l); }
void destroy_lt_preference(cublasLtMatmulPreference_t p) { CublasLtLibrary::opened().pref_destroy(p); }

Result<LtLinear> LtLinear::create(int64_t workspace_bytes) {
  MX_ASSIGN_OR_RETURN(const CublasLtLibrary* lib, CublasLtLibrary::get());
  LtLinear lt;
  cublasLtHandle_t h = nullptr;
  MX_CUBLAS_RETURN_IF_ERROR(lib->create(&h));
  lt.handle_ = LtHandleOwner(h);
  void* ws = nullptr;
  MX_CUDA_RETURN_IF_ERROR(cudaMalloc(&ws, static_cast<size_t>(workspace_bytes)));
  lt.workspace_owner_.reset(ws);
  lt.workspace_ = ws;
  lt.workspace_bytes_ = workspace_bytes;
  return lt;
}

Result<LtLinear::Plan*> LtLinear::plan(const Key& key) {
  const CublasLtLibrary& lib = CublasLtLibrary::opened();  // create() opened it
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  const auto [m, n, k, out_f32, has_bias, ldd] = key;
  auto p = std::make_unique<Plan>();
  cublasLtMatmulDesc_t desc = nullptr;
  MX_CUBLAS_RETURN_IF_ERROR(lib.desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  p->desc = LtMatmulDescOwner(desc);
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  MX_CUBLAS_RETURN_IF_ERROR(lib.desc_set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  MX_CUBLAS_RETURN_IF_ERROR(lib.desc_set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (has_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    MX_CUBLAS_RETURN_IF_ERROR(lib.desc_set_attribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    const cudaDataType_t bias_type = CUDA_R_16BF;
    MX_CUBLAS_RETURN_IF_ERROR(
        lib.desc_set_attribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  const cudaDataType_t out_type = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  // Column-major views: A = W as [k, n] (ld k), B = x^T as [k, m] (ld k), D = out^T as [n, m] (ld n).
  MX_CUBLAS_RETURN_IF_ERROR(lib.layout_create(&a, CUDA_R_16BF, k, n, k));
  p->a = LtLayoutOwner(a);
  MX_CUBLAS_RETURN_IF_ERROR(lib.layout_create(&b, CUDA_R_16BF, k, m, k));
  p->b = LtLayoutOwner(b);
  MX_CUBLAS_RETURN_IF_ERROR(lib.layout_create(&d, out_type, n, m, ldd));
  p->d = LtLayoutOwner(d);
  MX_ASSIGN_OR_RETURN(std::vector<cublasLtMatmulHeuristicResult_t> found, heuristic(*p, 1));
  if (found.empty())
    return unimplemented("cuBLASLt has no algorithm for " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                         std::to_string(k));
  p->algo = found[0].algo;
  Plan* raw = p.get();
  plans_.emplace(key, std::move(p));
  return raw;
}

Result<std::vector<cublasLtMatmulHeuristicResult_t>> LtLinear::heuristic(const Plan& p, int count) {
  const CublasLtLibrary& lib = CublasLtLibrary::opened();
  cublasLtMatmulPreference_t pref = nullptr;
  MX_CUBLAS_RETURN_IF_ERROR(lib.pref_create(&pref));
  LtPreferenceOwner pref_owner(pref);
  const uint64_t ws = static_cast<uint64_t>(workspace_bytes_);
  MX_CUBLAS_RETURN_IF_ERROR(
      lib.pref_set_attribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
  int found = 0;
  MX_CUBLAS_RETURN_IF_ERROR(lib.algo_get_heuristic(handle_.get(), p.desc.get(), p.a.get(), p.b.get(), p.d.get(),
                                                   p.d.get(), pref, count, results.data(), &found));
  results.resize(static_cast<size_t>(found));
  return results;
}

Result<std::vector<LtLinear::Candidate>> LtLinear::candidates(int64_t m, int64_t n, int64_t k, bool out_f32,
                                                              bool has_bias, int count) {
  MX_ASSIGN_OR_RETURN(Plan * p, plan(Key{m, n, k, out_f32, has_bias, n}));
  MX_ASSIGN_OR_RETURN(std::vector<cublasLtMatmulHeuristicResult_t> found, heuristic(*p, count));
  const CublasLtLibrary& lib = CublasLtLibrary::opened();
  std::vector<Candidate> out;
  for (const cublasLtMatmulHeuristicResult_t& r : found) {
    auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
      uint32_t v = 0;
      size_t written = 0;
      return lib.algo_config_get(&r.algo, attr, &v, sizeof(v), &written) == CUBLAS_STATUS_SUCCESS ? v : ~0u;
    };
    const std::string config =
        "algo " + std::to_string(get(CUBLASLT_ALGO_CONFIG_ID)) + " tile " + std::to_string(get(CUBLASLT_ALGO_CONFIG_TILE_ID)) +
        " stages " + std::to_string(get(CUBLASLT_ALGO_CONFIG_STAGES_ID)) + " splitk " +
        std::to_string(get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) + " red " +
        std::to_string(get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)) + " swz " +
        std::to_string(get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)) + " cluster " +
        std::to_string(get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)) + " waves " + std::to_string(r.wavesCount);
    out.push_back({r.algo, config});
  }
  return out;
}

Status LtLinear::run(const void* x, const void* w, const void* bias, void* out, int64_t m, int64_t n, int64_t k,
                     bool out_f32, cudaStream_t stream, int64_t ldd, const cublasLtMatmulAlgo_t* algo) {
  MX_ASSIGN_OR_RETURN(Plan * p, plan(Key{m, n, k, out_f32, bias != nullptr, ldd > 0 ? ldd : n}));
  const CublasLtLibrary& lib = CublasLtLibrary::opened();
  if (bias)
    MX_CUBLAS_RETURN_IF_ERROR(
        lib.desc_set_attribute(p->desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.0f, beta = 0.0f;
  MX_CUBLAS_RETURN_IF_ERROR(lib.matmul(handle_.get(), p->desc.get(), &alpha, w, p->a.get(), x, p->b.get(), &beta, out,
                                       p->d.get(), out, p->d.get(), algo ? algo : &p->algo, workspace_,
                                       static_cast<size_t>(workspace_bytes_), stream));
  return Status::ok();
}

}  // namespace mx::cuda
