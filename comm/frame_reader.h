#pragma once
// FrameReader: reads frames off one socket, one at a time, on the socket's io thread. Reads
// go through a small staging buffer, so a small frame costs one system call. The fixed
// header is checked against the limits before anything is allocated; the JSON header is
// depth-checked; the tensor bytes beyond what was staged land straight in the message's
// tensors, with a receive low-water mark so a large frame costs few wake-ups, and are
// checksummed as they land, while still in cache. Every completed read, even a partial one,
// counts as progress (`on_bytes`), so a large frame arriving slowly but steadily keeps its
// connection alive.
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "comm/asio.h"

#include "comm/frame.h"

namespace pipit {

class FrameReader {
 public:
  using OnFrame = std::function<void(Message)>;
  using OnError = std::function<void(const std::string& reason)>;

  FrameReader(asio::ip::tcp::socket& socket, std::function<void()> on_bytes)
      : socket_(socket), on_bytes_(std::move(on_bytes)) {}

  // Reads the next frame within `limits`; calls exactly one of on_frame and on_error.
  // `owner` is kept alive until then (the connection this reader belongs to).
  void read(const FrameLimits& limits, std::shared_ptr<void> owner, OnFrame on_frame,
            OnError on_error);

 private:
  struct Pending;
  // Fills `destination` from the staged bytes, then from the socket; calls `done` when full,
  // else the frame's on_error naming `where` the read failed.
  template <class Done>
  void fill(asio::mutable_buffer destination, std::shared_ptr<Pending> pending, const char* where,
            Done done);
  void landed(Pending& pending, size_t bytes);
  void read_header(std::shared_ptr<Pending> pending);
  void read_body(std::shared_ptr<Pending> pending);
  void read_tensors(std::shared_ptr<Pending> pending);
  void read_tensor_bytes(std::shared_ptr<Pending> pending);
  void finish(std::shared_ptr<Pending> pending);

  asio::ip::tcp::socket& socket_;
  std::function<void()> on_bytes_;
  size_t low_watermark_ = 1;  // the socket's SO_RCVLOWAT, as last set
  // Bytes read ahead of the frame being parsed, so a small frame (and the start of a large
  // one) costs one read: [staged_begin_, staged_end_) of stage_.
  std::vector<uint8_t> stage_;
  size_t staged_begin_ = 0, staged_end_ = 0;
};

}  // namespace pipit
