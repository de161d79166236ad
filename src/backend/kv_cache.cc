#include "backend/kv_cache.h"

#include <algorithm>

namespace mx {

KvLayout KvLayout::from_layers(std::vector<KvLayerSpec> layers) {
  KvLayout layout;
  layout.layers = std::move(layers);
  for (const KvLayerSpec& spec : layout.layers) {
    const auto it = std::find(layout.groups.begin(), layout.groups.end(), spec);
    layout.layer_group.push_back(it - layout.groups.begin());
    if (it == layout.groups.end()) layout.groups.push_back(spec);
  }
  return layout;
}

int64_t KvLayout::group_num_layers(int64_t group) const {
  return std::count(layer_group.begin(), layer_group.end(), group);
}

int64_t KvLayout::group_bytes_per_token(int64_t group, DType dtype) const {
  const KvLayerSpec& s = groups[static_cast<size_t>(group)];
  return (s.shared_kv ? 1 : 2) * group_num_layers(group) * dtype_bytes(dtype, s.n_kv * s.head_dim);
}

int64_t KvLayout::bytes_per_token(DType dtype) const {
  int64_t total = 0;
  for (int64_t g = 0; g < num_groups(); ++g) total += group_bytes_per_token(g, dtype);
  return total;
}

KvCacheShape KvCacheShape::uniform(const KvLayout& layout, int64_t num_pages, int64_t page_size) {
  return KvCacheShape{layout, page_size, std::vector<int64_t>(static_cast<size_t>(layout.num_groups()), num_pages)};
}

int64_t KvCacheShape::bytes(DType dtype) const {
  int64_t total = 0;
  for (int64_t g = 0; g < layout.num_groups(); ++g)
    total += layout.group_bytes_per_token(g, dtype) * page_size * group_pages[static_cast<size_t>(g)];
  return total;
}

Result<KvCache> KvCache::allocate(Backend& backend, const KvCacheShape& shape) {
  return allocate(std::vector<Backend*>(static_cast<size_t>(shape.layout.num_layers()), &backend), shape);
}

Result<KvCache> KvCache::allocate(const std::vector<Backend*>& layer_backends, const KvCacheShape& shape) {
  const KvLayout& layout = shape.layout;
  if (static_cast<int64_t>(layer_backends.size()) != layout.num_layers())
    return invalid_argument("KV cache needs one backend per layer");
  if (layout.num_layers() <= 0 || shape.page_size <= 0 || static_cast<int64_t>(shape.group_pages.size()) != layout.num_groups())
    return invalid_argument("KV cache needs layers, a positive page size and a page count per layer group");
  for (int64_t g = 0; g < layout.num_groups(); ++g) {
    const KvLayerSpec& s = layout.groups[static_cast<size_t>(g)];
    if (shape.group_pages[static_cast<size_t>(g)] <= 0 || s.n_kv <= 0 || s.head_dim <= 0)
      return invalid_argument("KV cache dimensions must be positive");
  }
  KvCache cache;
  cache.shape_ = shape;
  for (int64_t l = 0; l < layout.num_layers(); ++l) {
    Backend& backend = *layer_backends[static_cast<size_t>(l)];
    const DType dtype = backend.kv_dtype();
    const int64_t g = layout.layer_group[static_cast<size_t>(l)];
    const KvLayerSpec& s = layout.layers[static_cast<size_t>(l)];
    const Shape layer_shape{shape.group_pages[static_cast<size_t>(g)], shape.page_size, s.n_kv, s.head_dim};
    const int64_t bytes = dtype_bytes(dtype, layer_shape.numel());
    KvLayerView view;
    view.page_size = shape.page_size;
    view.group = g;
    MX_ASSIGN_OR_RETURN(Buffer k, backend.allocate(bytes));
    view.k = k.view(dtype, layer_shape);
    cache.buffers_.push_back(std::move(k));
    if (s.shared_kv) {
      view.v = view.k;
    } else {
      MX_ASSIGN_OR_RETURN(Buffer v, backend.allocate(bytes));
      view.v = v.view(dtype, layer_shape);
      cache.buffers_.push_back(std::move(v));
    }
    cache.layers_.push_back(view);
  }
  return cache;
}

}  // namespace mx
