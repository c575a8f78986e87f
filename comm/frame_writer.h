#pragma once
// FrameWriter: the ordered queue of frames going out on one socket, written whole with
// gathering writes (tensor bytes go from where they lie), one frame at a time, on the
// socket's io thread.
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include "comm/asio.h"

#include "comm/frame.h"

namespace pipit {

class FrameWriter {
 public:
  using OnError = std::function<void(const std::string& reason)>;

  // on_drained runs each time the queue empties; on_error when a write fails (the frames
  // still queued are dropped).
  FrameWriter(asio::ip::tcp::socket& socket, std::function<void()> on_drained, OnError on_error)
      : socket_(socket), on_drained_(std::move(on_drained)), on_error_(std::move(on_error)) {}

  // `owner` is kept alive while a write is in flight (the connection this writer belongs to).
  void push(EncodedFrame frame, std::shared_ptr<void> owner);
  bool busy() const { return writing_; }
  size_t queued_bytes() const { return queued_bytes_; }

 private:
  void write_next(std::shared_ptr<void> owner);

  asio::ip::tcp::socket& socket_;
  std::function<void()> on_drained_;
  OnError on_error_;
  std::deque<EncodedFrame> queue_;
  size_t queued_bytes_ = 0;
  bool writing_ = false;
  bool failed_ = false;
};

}  // namespace pipit
