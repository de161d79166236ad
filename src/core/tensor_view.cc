#include "core/tensor_view.h"

#include <sstream>

namespace mx {

Shape::Shape(std::initializer_list<int64_t> d) {
  MX_CHECK(d.size() <= static_cast<size_t>(kMaxDims)) << "rank " << d.size();
  for (int64_t v : d) dims[rank++] = v;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[i];
  return n;
}

bool Shape::operator==(const Shape& other) const {
  if (rank != other.rank) return false;
  for (int i = 0; i < rank; ++i)
    if (dims[i] != other.dims[i]) return false;
  return true;
}

std::string Shape::to_string() const {
  std::ostringstream out;
  out << '[';
  for (int i = 0; i < rank; ++i) out << (i ? ", " : "") << dims[i];
  out << ']';
  return out.str();
}

TensorView TensorView::reshaped(Shape shape) const {
  MX_CHECK_EQ(shape.numel(), numel()) << shape.to_string() << " from " << shape_.to_string();
  return TensorView(data_, dtype_, shape, device_);
}

TensorView TensorView::rows(int64_t begin, int64_t end) const {
  MX_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0))
      << "rows [" << begin << ", " << end << ") of " << shape_.to_string();
  const int64_t row_elems = dim(0) ? numel() / dim(0) : 0;
  Shape s = shape_;
  s.dims[0] = end - begin;
  auto* base = static_cast<char*>(data_) + dtype_bytes(dtype_, begin * row_elems);
  return TensorView(base, dtype_, s, device_);
}

}  // namespace mx
