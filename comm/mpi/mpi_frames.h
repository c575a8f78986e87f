#pragma once
// A pipit frame over MPI in two messages, so that neither side copies tensor bytes:
//   head (kHeadTag): 16 bytes of route (int32 source and destination endpoint, uint64 bytes
//         of the body message), then the frame's fixed header, JSON header and body prefix
//         (the tensors' safetensors header);
//   body (kBodyTag, only when the tensors have more than kMostInlined bytes): the tensors'
//         bytes, sent from where they lie and received straight into the tensors the head
//         describes, each side through a derived datatype over those addresses.
// Up to kMostInlined tensor bytes ride in the head instead (the route's body size is then
// 0): copying them twice costs less than a second message, whose matching takes the
// receiving progress thread another round.
// MPI keeps the messages of one source, tag and communicator in order, so a receiver that
// posts each body's receive in the order the heads arrived matches every body to its head;
// the body's size in the route lets it receive (and drop) the body of a malformed head too.
// The frame's checksum covers its headers, and its tensors' bytes where the sender chose
// (MpiOptions::checksum_tensor_bytes); a receiver accepts either. Only a thread that holds
// the transport's MPI lock calls these.
#include <mpi.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/frame.h"

namespace pipit {

constexpr int kHeadTag = 7;
constexpr int kBodyTag = 8;
constexpr size_t kMostInlined = size_t{64} << 10;

// MPI reports a failed call: throws Error naming the call and MPI's reason.
void check_mpi(int code, const char* call);

// One frame on its way to `rank`; the tensors stay alive (and must not change) until done().
// Once started it must not move: MPI holds the address of its head.
class OutgoingFrame {
 public:
  OutgoingFrame(int rank, int source_endpoint, int destination_endpoint, EncodedFrame frame);
  OutgoingFrame(OutgoingFrame&&) = default;
  OutgoingFrame& operator=(OutgoingFrame&&) = default;
  void start();
  bool done();  // both messages are out (MPI_Test)
  int rank() const { return rank_; }

 private:
  int rank_;
  std::string head_;
  EncodedFrame frame_;
  std::array<MPI_Request, 2> requests_{MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

// One frame from `source_rank` whose head has arrived; its body, if any, is being received.
class IncomingFrame {
 public:
  // Takes the head MPI matched (`size` bytes at `head`).
  IncomingFrame(int source_rank, std::unique_ptr<char[]> head, size_t size);
  // Allocates the tensors and starts receiving the body into them: the frames of one source
  // must start in the order their heads came.
  void start();
  bool started() const { return started_; }
  uint64_t body_bytes() const { return body_bytes_; }
  IncomingFrame(IncomingFrame&&) = default;
  IncomingFrame& operator=(IncomingFrame&&) = default;
  bool done();  // the body is in (at once when there is none); needs start()
  int destination() const { return destination_; }
  // The message, its checksum verified; throws FrameError naming what was malformed.
  Message message() &&;

 private:
  void receive_body();

  int source_rank_;
  int32_t source_ = 0, destination_ = -1;
  uint64_t body_bytes_ = 0;
  bool started_ = false;
  std::unique_ptr<char[]> head_bytes_;
  std::string_view head_;
  std::string malformed_;  // why the frame is dropped; its body lands in dropped_body_
  std::unique_ptr<char[]> dropped_body_;
  FrameHeader header_;
  size_t json_begin_ = 0, prefix_begin_ = 0, prefix_length_ = 0;
  std::vector<Tensor> tensors_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

}  // namespace pipit
