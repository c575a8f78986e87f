#include "comm/frame_reader.h"

#include <algorithm>
#include <cstring>

namespace pipit {

namespace {

std::string describe(const asio::error_code& ec, const char* where) {
  if (ec == asio::error::eof) return std::string("peer closed the connection ") + where;
  return std::string("read failed ") + where + ": " + ec.message();
}

}  // namespace

// One frame in progress.
struct FrameReader::Pending {
  FrameLimits limits;
  std::shared_ptr<void> owner;
  OnFrame on_frame;
  OnError on_error;
  uint8_t header_bytes[kFrameHeaderSize] = {};
  FrameHeader header;
  std::string json, body_prefix;
  std::vector<Tensor> tensors;
  std::vector<asio::mutable_buffer> pieces;  // tensor bytes still to come
  size_t remaining = 0;
  Crc32c crc;            // of the frame's bytes so far, its checksum field aside
  bool started = false;  // any byte of this frame arrived
};

void FrameReader::read(const FrameLimits& limits, std::shared_ptr<void> owner, OnFrame on_frame,
                       OnError on_error) {
  auto pending = std::make_shared<Pending>();
  pending->limits = limits;
  pending->owner = std::move(owner);
  pending->on_frame = std::move(on_frame);
  pending->on_error = std::move(on_error);
  // A peer is allowed a large staging buffer only once it may send bodies (after the
  // handshake), so an unauthenticated connection costs little memory.
  const size_t stage_bytes = limits.max_body_bytes == 0 ? 512 : size_t{64} << 10;
  if (stage_.size() < stage_bytes) stage_.resize(stage_bytes);
  if (staged_begin_ == staged_end_) return read_header(std::move(pending));
  // The next frame is already staged: parse it from the io loop, not from inside the handler
  // of the last one, so a burst of small frames cannot nest calls without bound.
  asio::post(socket_.get_executor(), [this, pending] { read_header(pending); });
}

template <class Done>
void FrameReader::fill(asio::mutable_buffer destination, std::shared_ptr<Pending> p,
                       const char* where, Done done) {
  const size_t staged = std::min(destination.size(), staged_end_ - staged_begin_);
  std::memcpy(destination.data(), stage_.data() + staged_begin_, staged);
  staged_begin_ += staged;
  destination += staged;
  if (destination.size() == 0) return done();
  staged_begin_ = staged_end_ = 0;
  if (destination.size() >= stage_.size()) {  // a large JSON header goes straight into place
    asio::async_read(socket_, destination,
                     [this, p, where, done](const asio::error_code& ec, size_t) {
                       if (ec) return p->on_error(describe(ec, where));
                       on_bytes_();
                       done();
                     });
    return;
  }
  socket_.async_read_some(asio::buffer(stage_), [this, p, destination, where, done](
                                                    const asio::error_code& ec, size_t bytes) {
    if (ec) return p->on_error(describe(ec, where));
    on_bytes_();
    staged_end_ = bytes;
    fill(destination, p, where, done);
  });
}

void FrameReader::read_header(std::shared_ptr<Pending> p) {
  fill(asio::buffer(p->header_bytes), p, "between frames", [this, p] {
    try {
      p->header = decode_frame_header(p->header_bytes, p->limits);
    } catch (const FrameError& e) {
      return p->on_error(e.what());
    }
    p->json.resize(p->header.header_length);
    fill(asio::buffer(p->json), p, "mid-frame", [this, p] { read_body(p); });
  });
}

// The body's prefix (its safetensors length and header) is read and validated first, so
// the tensors are allocated only for a well-formed body within the limits.
void FrameReader::read_body(std::shared_ptr<Pending> p) {
  p->crc = frame_checksum_begin(p->header, p->json);
  if (p->header.body_length == 0) return finish(p);
  p->body_prefix.resize(8);
  fill(asio::buffer(p->body_prefix), p, "mid-frame", [this, p] {
    size_t prefix = 0;
    try {
      prefix = frame_body_prefix_length(p->header,
                                        reinterpret_cast<const uint8_t*>(p->body_prefix.data()));
    } catch (const FrameError& e) {
      return p->on_error(e.what());
    }
    p->body_prefix.resize(prefix);
    fill(asio::buffer(p->body_prefix.data() + 8, prefix - 8), p, "mid-frame",
         [this, p] { read_tensors(p); });
  });
}

void FrameReader::read_tensors(std::shared_ptr<Pending> p) {
  try {
    p->tensors = plan_frame_body(p->header, p->body_prefix);
  } catch (const FrameError& e) {
    return p->on_error(e.what());
  }
  p->crc.update(p->body_prefix);
  for (const Tensor& t : p->tensors) {
    if (t.nbytes() == 0) continue;
    p->pieces.push_back(asio::buffer(t.raw_data(), t.nbytes()));
    p->remaining += t.nbytes();
  }
  while (staged_begin_ < staged_end_ && !p->pieces.empty()) {
    const size_t bytes = std::min(staged_end_ - staged_begin_, p->pieces.front().size());
    std::memcpy(p->pieces.front().data(), stage_.data() + staged_begin_, bytes);
    staged_begin_ += bytes;
    landed(*p, bytes);
  }
  read_tensor_bytes(p);
}

// Checksums `bytes` just written at the front of the piece list and drops what they filled.
void FrameReader::landed(Pending& p, size_t bytes) {
  p.remaining -= bytes;
  while (bytes > 0) {
    asio::mutable_buffer& front = p.pieces.front();
    const size_t filled = std::min(bytes, front.size());
    p.crc.update(front.data(), filled);
    bytes -= filled;
    if (filled < front.size()) {
      front += filled;
      break;
    }
    p.pieces.erase(p.pieces.begin());
  }
}

// The kernel would wake this thread for every 64 KiB that arrives; a receive low-water mark
// lets it wake once per kLargeRead (or for the frame's last bytes), which keeps large
// transfers near raw socket speed. The communicator's liveness check also counts bytes
// waiting below the mark (see TcpConnection::has_progress).
// Small frames leave the mark alone: two system calls per message cost more than they save.
void FrameReader::read_tensor_bytes(std::shared_ptr<Pending> p) {
  constexpr size_t kLargeRead = 1 << 20, kWorthAMark = 64 << 10;
  asio::error_code ignored;
  if (p->remaining == 0) {
    if (low_watermark_ > 1) {
      socket_.set_option(asio::socket_base::receive_low_watermark(1), ignored);
      low_watermark_ = 1;
    }
    return finish(p);
  }
  const size_t mark = p->remaining >= kWorthAMark ? std::min(p->remaining, kLargeRead) : 1;
  if (mark != low_watermark_) {
    socket_.set_option(asio::socket_base::receive_low_watermark(static_cast<int>(mark)), ignored);
    low_watermark_ = mark;
  }
  socket_.async_read_some(p->pieces, [this, p](const asio::error_code& ec, size_t bytes) {
    if (ec) return p->on_error(describe(ec, "mid-frame"));
    on_bytes_();
    landed(*p, bytes);
    read_tensor_bytes(p);
  });
}

void FrameReader::finish(std::shared_ptr<Pending> p) {
  Message message;
  try {
    require_frame_checksum(p->header, p->crc);
    message = decode_frame_message(p->header, p->json, std::move(p->tensors));
  } catch (const Error& e) {
    return p->on_error(e.what());
  }
  p->on_frame(std::move(message));
}

}  // namespace pipit
