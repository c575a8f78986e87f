#include "comm/frame_writer.h"

#include <vector>

namespace pipit {

void FrameWriter::push(EncodedFrame frame, std::shared_ptr<void> owner) {
  if (failed_) return;
  queued_bytes_ += frame.size();
  queue_.push_back(std::move(frame));
  if (!writing_) write_next(std::move(owner));
}

void FrameWriter::write_next(std::shared_ptr<void> owner) {
  if (queue_.empty()) {
    writing_ = false;
    on_drained_();
    return;
  }
  writing_ = true;
  const EncodedFrame& frame = queue_.front();
  std::vector<asio::const_buffer> buffers{asio::buffer(frame.prefix)};
  for (const auto& [data, size] : frame.tensor_bytes) buffers.push_back(asio::buffer(data, size));
  // Asio's default completion condition caps every write at 64 KiB; a frame goes in as few
  // system calls as the socket buffer allows.
  auto whole_frame = [](const asio::error_code& ec, size_t) -> size_t {
    return ec ? 0 : size_t{1} << 30;
  };
  asio::async_write(socket_, buffers, whole_frame,
                    [this, owner](const asio::error_code& ec, size_t) {
                      if (ec) {
                        failed_ = true;
                        writing_ = false;
                        queue_.clear();
                        queued_bytes_ = 0;
                        return on_error_("write failed: " + ec.message());
                      }
                      queued_bytes_ -= queue_.front().size();
                      queue_.pop_front();
                      write_next(owner);
                    });
}

}  // namespace pipit
