#include "model/weight_loader.h"

#include <set>

namespace mx {

Status bind_weights(const Checkpoint& checkpoint, const std::vector<WeightSpec>& specs,
                    const std::vector<std::string>& skipped_prefixes) {
  std::set<std::string> claimed;
  for (const auto& spec : specs) {
    MX_ASSIGN_OR_RETURN(TensorView view, checkpoint.get(spec.name));
    if (view.dtype() != spec.dtype)
      return invalid_argument("tensor '" + spec.name + "' has dtype " + dtype_name(view.dtype()) + ", expected " +
                              dtype_name(spec.dtype));
    if (view.shape() != spec.shape)
      return invalid_argument("tensor '" + spec.name + "' has shape " + view.shape().to_string() + ", expected " +
                              spec.shape.to_string());
    *spec.destination = view;
    claimed.insert(spec.name);
  }
  auto skipped = [&](const std::string& name) {
    for (const auto& prefix : skipped_prefixes)
      if (name.compare(0, prefix.size(), prefix) == 0) return true;
    return false;
  };
  for (const auto& name : checkpoint.names())
    if (!claimed.count(name) && !skipped(name)) return invalid_argument("unexpected tensor '" + name + "' in the checkpoint");
  return Status::ok();
}

}  // namespace mx
