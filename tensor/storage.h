#pragma once
#include <cstddef>
#include <functional>

#include "tensor/device.h"

namespace pipit {

// A block of device memory that tensors view. CPU blocks are 64-byte aligned.
class Storage {
 public:
  using Deleter = std::function<void(void*)>;
  Storage(void* data, size_t nbytes, Device device, Deleter deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t nbytes_;
  Device device_;
  Deleter deleter_;
};

}  // namespace pipit
