#include "backend/kv_cache.h"

namespace mx {

Result<KvCache> KvCache::allocate(Backend& backend, const KvCacheShape& shape) {
  if (shape.num_layers <= 0 || shape.num_pages <= 0 || shape.page_size <= 0 || shape.n_kv <= 0 || shape.head_dim <= 0)
    return invalid_argument("KV cache dimensions must be positive");
  KvCache cache;
  cache.shape_ = shape;
  const DType dtype = backend.kv_dtype();
  const Shape layer_shape{shape.num_pages, shape.page_size, shape.n_kv, shape.head_dim};
  const int64_t bytes = dtype_bytes(dtype, layer_shape.numel());
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    MX_ASSIGN_OR_RETURN(Buffer k, backend.allocate(bytes));
    MX_ASSIGN_OR_RETURN(Buffer v, backend.allocate(bytes));
    KvLayerView view;
    view.k = k.view(dtype, layer_shape);
    view.v = v.view(dtype, layer_shape);
    view.page_size = shape.page_size;
    cache.layers_.push_back(view);
    cache.buffers_.push_back(std::move(k));
    cache.buffers_.push_back(std::move(v));
  }
  return cache;
}

}  // namespace mx
