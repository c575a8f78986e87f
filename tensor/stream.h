#pragma once
// Stream: an ordered queue of work on one device. Ops on CUDA tensors are queued on the
// calling thread's current stream for that device; a StreamGuard changes it for a scope (a
// pipeline Stage holds one for its whole life, so stages on one GPU overlap). CPU ops run when
// called, so a CPU stream has nothing to wait for.
#include <memory>

#include "tensor/device.h"
#include "tensor/tensor.h"

namespace pipit {

class Stream;
Stream current_stream(Device device);

class Stream {
 public:
  // The device's default stream (CUDA's legacy stream, which orders itself with every other).
  static Stream default_stream(Device device);
  // A new stream of its own on `device`.
  static Stream create(Device device);
  // A new stream that does not order itself with the default stream (cudaStreamNonBlocking):
  // it waits only for what events tell it to, so capturing a cuda::Graph on it leaves other
  // threads' default-stream work alone.
  static Stream create_independent(Device device);

  Device device() const { return device_; }
  // The cudaStream_t, or null for a CPU stream and for CUDA's default stream.
  void* handle() const { return handle_.get(); }
  // Blocks until every op queued on this stream has finished.
  void synchronize() const;
  bool operator==(const Stream& other) const {
    return device_ == other.device_ && handle() == other.handle();
  }

 private:
  friend Stream current_stream(Device device);
  static Stream make(Device device, bool blocking);
  Stream(Device device, std::shared_ptr<void> handle)
      : device_(device), handle_(std::move(handle)) {}
  Device device_;
  std::shared_ptr<void> handle_;
};

// The stream ops on `device` go to from this thread (declared above).

// Makes `stream` the current stream of its device on this thread until destroyed.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream stream_;  // kept alive while current
  void* previous_;
};

// Tells the allocator that work queued on `stream` reads or writes `tensor`, which another
// stream allocated: when the tensor's memory is released, its next user waits for that work
// too. Needed when a tensor travels to a thread with another stream and the sender may drop
// the last reference (as torch's Tensor.record_stream). A no-op for CPU tensors.
void record_stream(const Tensor& tensor, const Stream& stream);

// Blocks until all work queued on `device`, on any stream, has finished.
void synchronize(Device device);

}  // namespace pipit
