// The paged KV cache's storage and its layout. A model describes every layer's KV geometry (KvLayerSpec);
// layers with identical geometry and window form a group, and each group has its own page pool: for every
// layer of the group a K and a V tensor of [group pages, page_size, n_kv, head_dim] in the backend's memory
// and dtype (V is K's storage where the model shares them). Which sequence owns which page is the runtime's
// business.
#pragma once

#include <vector>

#include "backend/backend.h"

namespace mx {

// One layer's KV as the model needs it.
struct KvLayerSpec {
  int64_t n_kv = 0;
  int64_t head_dim = 0;
  int64_t window = 0;      // keys a query sees, itself included; 0 = all earlier keys (full attention)
  bool shared_kv = false;  // V is K (one stored tensor), e.g. Gemma-4's global layers

  bool operator==(const KvLayerSpec&) const = default;
};

// Every layer's spec and the groups they form (in order of each group's first layer).
struct KvLayout {
  std::vector<KvLayerSpec> layers;
  std::vector<int64_t> layer_group;  // [num_layers] group of each layer
  std::vector<KvLayerSpec> groups;   // [num_groups] the spec the group's layers share

  static KvLayout from_layers(std::vector<KvLayerSpec> layers);
  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
  int64_t num_groups() const { return static_cast<int64_t>(groups.size()); }
  int64_t group_num_layers(int64_t group) const;
  // KV bytes one token takes in one group's layers (K, and V unless shared), and over all layers.
  int64_t group_bytes_per_token(int64_t group, DType dtype) const;
  int64_t bytes_per_token(DType dtype) const;
};

struct KvCacheShape {
  KvLayout layout;
  int64_t page_size = 0;
  std::vector<int64_t> group_pages;  // [num_groups] pages in each group's pool

  // Every group with `num_pages` pages.
  static KvCacheShape uniform(const KvLayout& layout, int64_t num_pages, int64_t page_size);
  int64_t bytes(DType dtype) const;
};

class KvCache {
 public:
  static Result<KvCache> allocate(Backend& backend, const KvCacheShape& shape);
  // Layer l's K and V on layer_backends[l] (tensor-parallel ranks keep their layers on their own devices).
  static Result<KvCache> allocate(const std::vector<Backend*>& layer_backends, const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }
  KvLayerView layer(int64_t index) const { return layers_[static_cast<size_t>(index)]; }

 private:
  KvCacheShape shape_;
  std::vector<Buffer> buffers_;
  std::vector<KvLayerView> layers_;
};

}  // namespace mx
