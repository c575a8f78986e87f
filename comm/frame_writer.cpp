#include "comm/frame_writer.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

namespace pipit {

namespace {

// Calls add(data, size) for the frame's bytes from `offset` on, in the pieces they lie in.
template <class Add>
void for_each_piece(const EncodedFrame& frame, size_t offset, Add add) {
  auto piece = [&](const void* data, size_t size) {
    if (offset >= size) {
      offset -= size;
      return;
    }
    add(static_cast<const char*>(data) + offset, size - offset);
    offset = 0;
  };
  piece(frame.prefix.data(), frame.prefix.size());
  for (const auto& [data, size] : frame.tensor_bytes) piece(data, size);
}

}  // namespace

FrameWriter::FrameWriter(asio::ip::tcp::socket& socket, std::function<void()> on_drained,
                         OnError on_error)
    : socket_(socket),
      fd_(socket.native_handle()),
      io_(socket.get_executor()),
      on_drained_(std::move(on_drained)),
      on_error_(std::move(on_error)) {
  mark_written();
}

void FrameWriter::send(EncodedFrame frame, std::shared_ptr<void> owner) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failed_ || stopped_) return;
  if (writing_) {
    queue_.push_back({std::move(frame), 0});
    return;
  }
  size_t written = 0;
  if (frame.size() <= kMostWrittenBySender) {
    std::string error;
    const int64_t result = write_without_blocking(frame, 0, error);
    if (result < 0) {
      failed_ = true;
      lock.unlock();
      asio::post(io_, [this, owner, error] { on_error_(error); });
      return;
    }
    written = static_cast<size_t>(result);
    if (written > 0) mark_written();
    if (written == frame.size()) return;
  }
  queue_.push_back({std::move(frame), written});
  writing_ = true;
  lock.unlock();
  asio::post(io_, [this, owner] { write_next(owner); });
}

int64_t FrameWriter::write_without_blocking(const EncodedFrame& frame, size_t offset,
                                            std::string& error) {
  std::vector<iovec> pieces;
  pieces.reserve(frame.tensor_bytes.size() + 1);
  for_each_piece(frame, offset, [&](const char* data, size_t size) {
    pieces.push_back({const_cast<char*>(data), size});
  });
  int64_t written = 0;
  size_t next = 0;
  while (next < pieces.size()) {
    const size_t count = std::min(pieces.size() - next, static_cast<size_t>(IOV_MAX));
    msghdr message{};
    message.msg_iov = pieces.data() + next;
    message.msg_iovlen = count;
    const ssize_t sent = ::sendmsg(fd_, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return written;
      error = std::string("write failed: ") + std::strerror(errno);
      return -1;
    }
    written += sent;
    size_t batch = 0;
    for (size_t i = next; i < next + count; ++i) batch += pieces[i].iov_len;
    if (static_cast<size_t>(sent) < batch) return written;
    next += count;
  }
  return written;
}

bool FrameWriter::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return writing_;
}

void FrameWriter::stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_ = true;
}

void FrameWriter::write_next(std::shared_ptr<void> owner) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopped_ || failed_) {
    queue_.clear();
    writing_ = false;
    return;
  }
  if (queue_.empty()) {
    writing_ = false;
    lock.unlock();
    on_drained_();
    return;
  }
  // Deque elements stay where they are while others are added behind them.
  const Queued& front = queue_.front();
  std::vector<asio::const_buffer> buffers;
  buffers.reserve(front.frame.tensor_bytes.size() + 1);
  for_each_piece(front.frame, front.written, [&](const char* data, size_t size) {
    buffers.push_back(asio::buffer(data, size));
  });
  lock.unlock();
  // Asio's default completion condition caps every write at 64 KiB; a frame goes in as few
  // system calls as the socket buffer allows.
  auto whole_frame = [](const asio::error_code& ec, size_t) -> size_t {
    return ec ? 0 : size_t{1} << 30;
  };
  asio::async_write(socket_, buffers, whole_frame,
                    [this, owner](const asio::error_code& ec, size_t) {
                      if (ec) return fail("write failed: " + ec.message());
                      mark_written();
                      {
                        std::lock_guard<std::mutex> guard(mutex_);
                        queue_.pop_front();
                      }
                      write_next(owner);
                    });
}

void FrameWriter::fail(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
    writing_ = false;
    queue_.clear();
  }
  on_error_(reason);
}

}  // namespace pipit
