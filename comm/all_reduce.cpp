#include "comm/all_reduce.h"

#include <algorithm>

#include "tensor/backend.h"

namespace pipit {
namespace {

constexpr int kReduce = 0, kResult = 1;

// Elements [begin, begin + length) of a contiguous tensor, as a 1-D view of its storage. The
// sums are buffers, not graph values: nothing here records autograd.
Tensor elements(const Tensor& tensor, int64_t begin, int64_t length) {
  return Tensor::from_storage(tensor.storage(), {length}, {1}, tensor.offset() + begin,
                              tensor.dtype());
}

}  // namespace

AllReduce::AllReduce(std::vector<int> members, int me, Tensor tensor, int64_t tag,
                     int64_t segment_elements, int64_t ready_elements)
    : members_(std::move(members)), tag_(tag), segment_elements_(segment_elements) {
  const auto it = std::find(members_.begin(), members_.end(), me);
  PIPIT_CHECK(it != members_.end(), "all_reduce: endpoint ", me, " is not a member of its group");
  PIPIT_CHECK(std::count(members_.begin(), members_.end(), me) == 1, "all_reduce: endpoint ", me,
              " is in its group twice");
  PIPIT_CHECK(tensor.defined() && tensor.is_contiguous(),
              "all_reduce: the tensor must be defined and contiguous");
  PIPIT_CHECK(segment_elements > 0, "all_reduce: segments must hold at least one element");
  index_ = static_cast<size_t>(it - members_.begin());
  flat_ = tensor.numel() > 0 ? elements(tensor, 0, tensor.numel()) : tensor;
  segments_ = (tensor.numel() + segment_elements - 1) / segment_elements;
  PIPIT_CHECK(ready_elements >= -1 && ready_elements <= tensor.numel(),
              "all_reduce: ", ready_elements, " ready elements of ", tensor.numel());
  ready_elements_ = ready_elements < 0 ? tensor.numel() : ready_elements;
  const size_t r = members_.size();
  // The last member forms every sum; the others take every result (the first also sends).
  remaining_ = r == 1 ? 0 : segments_;
  for (auto& taken : taken_) taken.assign(static_cast<size_t>(segments_), false);
}

Tensor AllReduce::segment(int64_t s) const {
  const int64_t begin = s * segment_elements_;
  return elements(flat_, begin, std::min(segment_elements_, flat_.numel() - begin));
}

bool AllReduce::ready(int64_t s) const {
  return std::min((s + 1) * segment_elements_, flat_.numel()) <= ready_elements_;
}

Message AllReduce::make(int phase, int64_t s, Tensor data) const {
  return Message(MessageKind::AllReduceSegment, tag_, static_cast<int>(s), phase,
                 {std::move(data)});
}

AllReduce::Outgoing AllReduce::start() {
  return make_ready(ready_elements_);
}

AllReduce::Outgoing AllReduce::make_ready(int64_t elements) {
  PIPIT_CHECK(elements >= ready_elements_ && elements <= flat_.numel(), "all_reduce ", tag_, ": ",
              elements, " ready elements after ", ready_elements_, " (of ", flat_.numel(), ")");
  ready_elements_ = elements;
  Outgoing out;
  if (members_.size() == 1) return out;
  if (index_ == 0) {
    // A copy: this tensor is overwritten when the result comes back, and a communicator in
    // one process hands the receiver the tensor itself.
    for (; sent_ < segments_ && ready(sent_); ++sent_) {
      const Tensor part = segment(sent_);
      out.emplace_back(members_[1],
                       make(kReduce, sent_, copy_of(part, part.dtype(), part.device())));
    }
    return out;
  }
  std::vector<std::pair<int64_t, Tensor>> still;
  for (auto& [s, received] : waiting_) {
    if (ready(s)) {
      reduce(s, received, out);
    } else {
      still.emplace_back(s, std::move(received));
    }
  }
  waiting_ = std::move(still);
  return out;
}

void AllReduce::reduce(int64_t s, const Tensor& received, Outgoing& out) {
  const Tensor mine = segment(s);
  // What arrived holds members 0..index-1 summed in order: add this member's part last.
  const Tensor sum = Tensor::empty(mine.shape(), mine.dtype(), mine.device());
  backend(mine).binary(BinaryOp::add, received, mine, sum);
  if (index_ + 1 < members_.size()) {
    out.emplace_back(members_[index_ + 1], make(kReduce, s, sum));
    return;
  }
  backend(mine).copy(sum, mine);
  out.emplace_back(members_[0], make(kResult, s, sum));
  --remaining_;
}

AllReduce::Outgoing AllReduce::receive(const Message& message) {
  const size_t r = members_.size();
  const int phase = message.chunk;
  const int64_t s = message.microbatch;
  PIPIT_CHECK(message.kind == MessageKind::AllReduceSegment && message.step == tag_, "all_reduce ",
              tag_, ": not one of its messages (", message_kind_name(message.kind), ", tag ",
              message.step, ")");
  PIPIT_CHECK((phase == kReduce || phase == kResult) && s >= 0 && s < segments_ &&
                  !taken_[phase][static_cast<size_t>(s)],
              "all_reduce ", tag_, ": unexpected segment ", s, " of phase ", phase, " from ",
              message.from);
  // Reduce: from the previous member. Result: to member 0 from the last, then down the chain.
  const size_t from = phase == kReduce ? index_ - 1 : index_ == 0 ? r - 1 : index_ - 1;
  PIPIT_CHECK(r > 1 && !(phase == kReduce && index_ == 0) &&
                  !(phase == kResult && index_ == r - 1) && message.from == members_[from],
              "all_reduce ", tag_, ": segment ", s, " of phase ", phase, " came from endpoint ",
              message.from, ", which does not send it to endpoint ", members_[index_]);
  const Tensor mine = segment(s);
  PIPIT_CHECK(message.tensors.size() == 1 && message.tensors[0].shape() == mine.shape() &&
                  message.tensors[0].dtype() == mine.dtype(),
              "all_reduce ", tag_, ": segment ", s, " from endpoint ", message.from, " is not one ",
              mine.dtype(), " tensor of shape ", shape_str(mine.shape()));
  taken_[phase][static_cast<size_t>(s)] = true;
  const Tensor& arrived = message.tensors[0];
  const Tensor received = arrived.device() == mine.device()
                              ? arrived
                              : copy_of(arrived, arrived.dtype(), mine.device());
  Outgoing out;
  if (phase == kReduce) {
    if (ready(s)) {
      reduce(s, received, out);
    } else {
      waiting_.emplace_back(s, received);
    }
    return out;
  }
  // A result exists only once every member's part, this one's included, was ready.
  backend(mine).copy(received, mine);
  if (index_ + 2 < r) out.emplace_back(members_[index_ + 1], make(kResult, s, received));
  --remaining_;
  return out;
}

void all_reduce(Communicator& comm, const std::vector<int>& members, const Tensor& tensor,
                int64_t tag, int64_t segment_elements, std::chrono::milliseconds timeout) {
  AllReduce reduce(members, comm.id(), tensor, tag, segment_elements);
  for (auto& [peer, message] : reduce.start()) comm.send(peer, std::move(message));
  while (!reduce.done()) {
    std::optional<Message> message = comm.try_receive(timeout);
    PIPIT_CHECK(message.has_value(), "all_reduce ", tag, ": endpoint ", comm.id(),
                " received nothing for ", timeout.count(), " ms");
    if (message->kind != MessageKind::AllReduceSegment || message->step != tag) continue;
    for (auto& [peer, out] : reduce.receive(*message)) comm.send(peer, std::move(out));
  }
}

}  // namespace pipit
