// TensorView: a non-owning, contiguous, row-major view of memory on the host or a device.
// Model code passes these between ops; owners (mmap'd checkpoints, backend buffers) live elsewhere.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/log.h"

namespace mx {

enum class Device : uint8_t { kCpu, kCuda };

inline constexpr int kMaxDims = 6;

struct Shape {
  int rank = 0;
  int64_t dims[kMaxDims] = {};

  Shape() = default;
  Shape(std::initializer_list<int64_t> d);
  int64_t numel() const;
  int64_t operator[](int i) const { return dims[i]; }
  bool operator==(const Shape& other) const;
  bool operator!=(const Shape& other) const { return !(*this == other); }
  std::string to_string() const;  // "[2, 3, 4]"
};

class TensorView {
 public:
  TensorView() = default;
  TensorView(void* data, DType dtype, Shape shape, Device device = Device::kCpu)
      : data_(data), dtype_(dtype), shape_(shape), device_(device) {}

  void* data() const { return data_; }
  template <typename T>
  T* ptr() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  Device device() const { return device_; }
  int rank() const { return shape_.rank; }
  int64_t dim(int i) const { return shape_.dims[i < 0 ? i + shape_.rank : i]; }
  int64_t numel() const { return shape_.numel(); }
  int64_t bytes() const { return dtype_bytes(dtype_, numel()); }
  bool empty() const { return data_ == nullptr; }

  // Same memory, another shape with the same number of elements.
  TensorView reshaped(Shape shape) const;
  // Rows [begin, end) along dimension 0.
  TensorView rows(int64_t begin, int64_t end) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Device device_ = Device::kCpu;
};

}  // namespace mx
