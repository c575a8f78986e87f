#pragma once
// FrameWriter: the ordered frames going out on one socket, written whole with gathering
// writes (tensor bytes go from where they lie).
//
// A frame of up to kMostWrittenBySender bytes sent while nothing is queued is written at
// once by the sending thread itself, as far as the socket takes it without blocking: a small
// message then costs no wake-up of the io thread. Larger frames, and what the socket does not
// take, are queued, and the io thread writes the queue in order (so a stage thread does not
// spend its time copying a large activation into the kernel); while it does, later frames
// queue behind it. One mutex orders the two writers and keeps the socket open while a
// sending thread writes to it.
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include "comm/asio.h"

#include "comm/frame.h"

namespace pipit {

// Copying this much into the kernel costs about what handing the frame to the io thread
// does (a wake-up, some tens of microseconds).
constexpr size_t kMostWrittenBySender = size_t{256} << 10;

class FrameWriter {
 public:
  using Clock = std::chrono::steady_clock;
  using OnError = std::function<void(const std::string& reason)>;

  // on_drained runs on the io thread each time the io thread empties the queue; on_error on
  // the io thread when a write fails (the frames still queued are dropped).
  FrameWriter(asio::ip::tcp::socket& socket, std::function<void()> on_drained, OnError on_error);

  // Any thread: writes the frame now if nothing is queued, else queues it behind the
  // others. `owner` is kept alive while the io thread has bytes of it to write.
  void send(EncodedFrame frame, std::shared_ptr<void> owner);
  // Io thread, before the socket closes: no thread writes to the socket after this returns.
  void stop();

  // Frames queued or being written by the io thread.
  bool busy() const;
  // When bytes last went out, by either writer.
  Clock::time_point last_write() const { return Clock::time_point(Clock::duration(last_write_)); }

 private:
  struct Queued {
    EncodedFrame frame;
    size_t written = 0;  // bytes of it already in the socket
  };
  // Writes as much of `frame` from byte `offset` as the socket takes without blocking.
  // Returns the bytes written, or -1 after a failure (its reason in `error`).
  int64_t write_without_blocking(const EncodedFrame& frame, size_t offset, std::string& error);
  void write_next(std::shared_ptr<void> owner);
  void fail(const std::string& reason);
  void mark_written() { last_write_ = Clock::now().time_since_epoch().count(); }

  asio::ip::tcp::socket& socket_;
  // Read once: the socket object itself is the io thread's.
  const int fd_;
  const asio::any_io_executor io_;
  std::function<void()> on_drained_;
  OnError on_error_;
  mutable std::mutex mutex_;
  std::deque<Queued> queue_;
  bool writing_ = false;  // the io thread owns the socket's writes until the queue drains
  bool failed_ = false;
  bool stopped_ = false;
  std::atomic<Clock::rep> last_write_;
};

}  // namespace pipit
