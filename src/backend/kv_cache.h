// The paged KV cache's storage: for every layer a K and a V tensor of [num_pages, page_size, n_kv, head_dim]
// in the backend's memory and dtype. Which sequence owns which page is the runtime's business.
#pragma once

#include <vector>

#include "backend/backend.h"

namespace mx {

struct KvCacheShape {
  int64_t num_layers = 0;
  int64_t num_pages = 0;
  int64_t page_size = 0;
  int64_t n_kv = 0;
  int64_t head_dim = 0;

  int64_t bytes_per_token(DType dtype) const { return 2 * num_layers * dtype_bytes(dtype, n_kv * head_dim); }
};

class KvCache {
 public:
  static Result<KvCache> allocate(Backend& backend, const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }
  KvLayerView layer(int64_t index) const { return layers_[static_cast<size_t>(index)]; }

 private:
  KvCacheShape shape_;
  std::vector<Buffer> buffers_;
  std::vector<KvLayerView> layers_;
};

}  // namespace mx
