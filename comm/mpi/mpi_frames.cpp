#include "comm/mpi/mpi_frames.h"

#include <climits>
#include <cstring>

namespace pipit {
namespace {

constexpr size_t kRouteBytes = 16;  // int32 source and destination endpoint, uint64 body bytes

// A datatype that gathers (or scatters) the bytes of `blocks`, addressed from MPI_BOTTOM.
// Blocks over INT_MAX bytes go in several pieces (MPI counts in int). Freed by the caller
// once the operation using it has started: MPI keeps it until that operation completes.
template <typename Pointer>
MPI_Datatype scattered_bytes(const std::vector<std::pair<Pointer, size_t>>& blocks) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> addresses;
  for (const auto& [data, bytes] : blocks) {
    for (size_t done = 0; done < bytes;) {
      const size_t piece = std::min<size_t>(bytes - done, INT_MAX);
      MPI_Aint address = 0;
      check_mpi(MPI_Get_address(static_cast<const char*>(data) + done, &address),
                "MPI_Get_address");
      addresses.push_back(address);
      lengths.push_back(static_cast<int>(piece));
      done += piece;
    }
  }
  MPI_Datatype type = MPI_DATATYPE_NULL;
  check_mpi(MPI_Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(),
                                     addresses.data(), MPI_BYTE, &type),
            "MPI_Type_create_hindexed");
  check_mpi(MPI_Type_commit(&type), "MPI_Type_commit");
  return type;
}

void require_frame(bool ok, int source_rank, const auto&... what) {
  if (!ok) throw FrameError(detail::concat("MPI: a frame from rank ", source_rank, " ", what...));
}

}  // namespace

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(detail::concat("MPI: ", call, " failed: ", std::string(text, length)));
}

OutgoingFrame::OutgoingFrame(int rank, int source_endpoint, int destination_endpoint,
                             EncodedFrame frame)
    : rank_(rank), frame_(std::move(frame)) {
  std::erase_if(frame_.tensor_bytes, [](const auto& block) { return block.second == 0; });
  const int32_t endpoints[2] = {source_endpoint, destination_endpoint};
  uint64_t tensor_bytes = 0;
  for (const auto& [data, bytes] : frame_.tensor_bytes) tensor_bytes += bytes;
  const bool inline_body = tensor_bytes <= kMostInlined;
  const uint64_t body_bytes = inline_body ? 0 : tensor_bytes;
  char route[kRouteBytes];
  std::memcpy(route, endpoints, sizeof endpoints);
  std::memcpy(route + sizeof endpoints, &body_bytes, sizeof body_bytes);
  if (!inline_body) {
    head_.assign(route, kRouteBytes);
    head_ += frame_.prefix;
    return;
  }
  head_ = frame_.joined(std::string_view(route, kRouteBytes));
  frame_.tensor_bytes.clear();
  frame_.keep_alive.clear();
}

void OutgoingFrame::start() {
  check_mpi(MPI_Isend(head_.data(), static_cast<int>(head_.size()), MPI_BYTE, rank_, kHeadTag,
                      MPI_COMM_WORLD, &requests_[0]),
            "MPI_Isend");
  if (frame_.tensor_bytes.empty()) return;
  MPI_Datatype body = scattered_bytes(frame_.tensor_bytes);
  check_mpi(MPI_Isend(MPI_BOTTOM, 1, body, rank_, kBodyTag, MPI_COMM_WORLD, &requests_[1]),
            "MPI_Isend");
  MPI_Type_free(&body);
}

bool OutgoingFrame::done() {
  int all = 0;
  check_mpi(MPI_Testall(2, requests_.data(), &all, MPI_STATUSES_IGNORE), "MPI_Testall");
  return all != 0;
}

IncomingFrame::IncomingFrame(int source_rank, std::unique_ptr<char[]> head, size_t size)
    : source_rank_(source_rank), head_bytes_(std::move(head)), head_(head_bytes_.get(), size) {
  if (head_.size() < kRouteBytes) {
    // Without the route the body's size is unknown: nothing more can be received for it.
    malformed_ = detail::concat("MPI: a frame from rank ", source_rank_, " has ", head_.size(),
                                " bytes, too short for its route");
    return;
  }
  std::memcpy(&source_, head_.data(), 4);
  std::memcpy(&destination_, head_.data() + 4, 4);
  std::memcpy(&body_bytes_, head_.data() + 8, 8);
}

void IncomingFrame::start() {
  started_ = true;
  if (!malformed_.empty()) return;
  try {
    receive_body();
  } catch (const Error& e) {
    malformed_ = e.what();
    tensors_.clear();
    if (body_bytes_ > 0 && body_bytes_ <= INT_MAX) {
      dropped_body_.reset(new char[body_bytes_]);
      check_mpi(MPI_Irecv(dropped_body_.get(), static_cast<int>(body_bytes_), MPI_BYTE,
                          source_rank_, kBodyTag, MPI_COMM_WORLD, &request_),
                "MPI_Irecv");
    }
  }
}

void IncomingFrame::receive_body() {
  require_frame(head_.size() >= kRouteBytes + kFrameHeaderSize, source_rank_, "has ", head_.size(),
                " bytes, too short for a frame header");
  FrameLimits limits;
  limits.accept_unchecked_tensor_bytes = true;  // MPI vouches for the bytes it delivers
  header_ =
      decode_frame_header(reinterpret_cast<const uint8_t*>(head_.data()) + kRouteBytes, limits);
  json_begin_ = kRouteBytes + kFrameHeaderSize;
  prefix_begin_ = json_begin_ + header_.header_length;
  require_frame(prefix_begin_ <= head_.size(), source_rank_, "has a JSON header of ",
                header_.header_length, " bytes, more than its head holds");
  const std::string_view prefix = head_.substr(prefix_begin_);
  if (header_.body_length == 0) {
    require_frame(prefix.empty() && body_bytes_ == 0, source_rank_, "has no body but ",
                  prefix.size(), " bytes follow its JSON header");
    return;
  }
  require_frame(prefix.size() >= 8, source_rank_, "has a body but no body prefix");
  prefix_length_ =
      frame_body_prefix_length(header_, reinterpret_cast<const uint8_t*>(prefix.data()));
  const size_t inlined = body_bytes_ == 0 ? header_.body_length - prefix_length_ : 0;
  require_frame(prefix.size() == prefix_length_ + inlined, source_rank_, "has ", prefix.size(),
                " bytes after its JSON header, its body prefix ", prefix_length_, " and ", inlined,
                " tensor bytes");
  require_frame(body_bytes_ == 0 || prefix_length_ + body_bytes_ == header_.body_length,
                source_rank_, "has a body of ", header_.body_length, " bytes, its route says ",
                prefix_length_, " + ", body_bytes_);
  tensors_ = plan_frame_body(header_, prefix.substr(0, prefix_length_));
  std::vector<std::pair<void*, size_t>> blocks;
  for (Tensor& t : tensors_) {
    if (t.nbytes() > 0) blocks.emplace_back(t.raw_data(), t.nbytes());
  }
  if (body_bytes_ == 0) {
    const char* next = prefix.data() + prefix_length_;
    for (const auto& [data, bytes] : blocks) {
      std::memcpy(data, next, bytes);
      next += bytes;
    }
    return;
  }
  MPI_Datatype body = scattered_bytes(blocks);
  check_mpi(MPI_Irecv(MPI_BOTTOM, 1, body, source_rank_, kBodyTag, MPI_COMM_WORLD, &request_),
            "MPI_Irecv");
  MPI_Type_free(&body);
}

bool IncomingFrame::done() {
  if (!started_) return false;
  int finished = 0;
  check_mpi(MPI_Test(&request_, &finished, MPI_STATUS_IGNORE), "MPI_Test");
  return finished != 0;
}

Message IncomingFrame::message() && {
  if (!malformed_.empty()) throw FrameError(malformed_);
  const std::string_view json = head_.substr(json_begin_, header_.header_length);
  try {
    verify_frame_checksum(header_, json, head_.substr(prefix_begin_, prefix_length_), tensors_);
  } catch (const FrameError&) {
    throw FrameError(
        detail::concat("MPI: a frame from rank ", source_rank_, " does not match its checksum"));
  }
  Message message = decode_frame_message(header_, json, std::move(tensors_));
  message.from = source_;
  return message;
}

}  // namespace pipit
