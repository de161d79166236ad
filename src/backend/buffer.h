// Buffer: owning memory handed out by a backend (host memory for the CPU backend, device memory for CUDA).
// Move-only RAII; views into it are TensorViews. No raw allocations outside the backends.
#pragma once

#include <cstdint>
#include <utility>

#include "core/tensor_view.h"

namespace mx {

class Buffer {
 public:
  using Deleter = void (*)(void*);

  Buffer() = default;
  Buffer(void* data, int64_t bytes, Device device, Deleter deleter)
      : data_(data), bytes_(bytes), device_(device), deleter_(deleter) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      reset();
      std::swap(data_, other.data_);
      std::swap(bytes_, other.bytes_);
      std::swap(device_, other.device_);
      std::swap(deleter_, other.deleter_);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // A view of the first bytes of this buffer with the given type and shape.
  TensorView view(DType dtype, Shape shape) const {
    MX_CHECK_LE(dtype_bytes(dtype, shape.numel()), bytes_) << "view " << shape.to_string() << " " << dtype_name(dtype);
    return TensorView(data_, dtype, shape, device_);
  }

 private:
  void reset() {
    if (data_ && deleter_) deleter_(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

  void* data_ = nullptr;
  int64_t bytes_ = 0;
  Device device_ = Device::kCpu;
  Deleter deleter_ = nullptr;
};

}  // namespace mx
