#include "tensor/storage.h"

namespace pipit {

Storage::Storage(void* data, size_t nbytes, Device device, Deleter deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (deleter_) deleter_(data_);
}

}  // namespace pipit
