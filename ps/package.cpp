#include "ps/package.h"

#include "autograd/ops.h"
#include "comm/control.h"
#include "comm/json_fields.h"
#include "ps/messages.h"

namespace pipit {
namespace {

constexpr int64_t kMaxCount = int64_t{1} << 40;

}  // namespace

Message to_message(const PsPackage& p) {
  Message message(PsKind::Package, 0);
  std::vector<std::string> weights;
  for (const auto& [name, t] : p.weights) {
    weights.push_back(name);
    message.tensors.push_back(t);
  }
  const bool data = p.inputs.defined();
  if (data) {
    message.tensors.push_back(p.inputs);
    message.tensors.push_back(p.targets);
  }
  message.meta = {{"role", p.role},
                  {"index", p.index},
                  {"sharing", p.sharing},
                  {"config", to_json(p.config)},
                  {"model", p.model},
                  {"checkpoint_dir", p.checkpoint_dir},
                  {"checkpoint_every", p.checkpoint_every},
                  {"resume", p.resume},
                  {"weights", weights},
                  {"shards", p.shards},
                  {"data", data},
                  {"batch", p.batch},
                  {"steps", p.steps},
                  {"slowdown", p.slowdown}};
  return message;
}

namespace {

// A worker's data has the batch's rows, and it knows every shard.
void check_worker_package(const PsPackage& p, const JsonFields<ControlError>& f) {
  if (p.inputs.dim() == 0 || p.targets.dim() == 0 || p.inputs.size(0) != p.targets.size(0) ||
      p.inputs.size(0) < p.batch) {
    f.fail("gives worker ", p.index, " inputs of shape ", shape_str(p.inputs.shape()),
           " and targets of shape ", shape_str(p.targets.shape()), ": both need the same ",
           "number of rows, at least batch = ", p.batch);
  }
  if (static_cast<int>(p.shards.size()) != p.config.servers) {
    f.fail("gives worker ", p.index, " ", p.shards.size(), " shard addresses for ",
           p.config.servers, " shards");
  }
}

}  // namespace

PsPackage read_ps_package(const Message& message) {
  if (message.kind != PsKind::Package) {
    throw ControlError(std::string("expected a PsPackage message, got ") +
                       message_kind_name(message.kind));
  }
  JsonFields<ControlError> f(message.meta, "PsPackage message");
  PsPackage p;
  p.role = f.string("role", 16);
  if (p.role != "shard" && p.role != "worker") {
    f.fail("field \"role\" is \"", p.role, "\", not \"shard\" or \"worker\"");
  }
  p.index = static_cast<int>(f.integer("index", 0, 1 << 16));
  p.sharing = static_cast<int>(f.integer("sharing", 1, 1 << 17));
  p.config = ps_config_from_json(f.object("config"), "PsPackage message field \"config\"");
  const int roles = p.role == "shard" ? p.config.servers : p.config.workers;
  if (p.index >= roles)
    f.fail("field \"index\" is ", p.index, ", but the run has ", roles, " ", p.role, "s");
  p.model = f.object("model");
  p.checkpoint_dir = f.string("checkpoint_dir", kMaxControlString);
  p.checkpoint_every = f.integer("checkpoint_every", 0, kMaxCount);
  p.resume = f.boolean("resume");
  const std::vector<std::string> weights = f.strings("weights", kMaxControlList, kMaxControlString);
  p.shards = f.strings("shards", 1024, kMaxControlString);
  const bool data = f.boolean("data");
  p.batch = f.integer("batch", 1, kMaxCount);
  p.steps = f.integer("steps", 0, kMaxCount);
  p.slowdown = f.number("slowdown");
  f.done();
  if (!(p.slowdown >= 1 && p.slowdown <= 1000)) f.fail("field \"slowdown\" is not in [1, 1000]");
  const size_t tensors = weights.size() + (data ? 2 : 0);
  if (tensors != message.tensors.size()) {
    f.fail("names ", tensors, " tensors but carries ", message.tensors.size());
  }
  size_t next = 0;
  for (const std::string& name : weights) {
    if (!p.weights.emplace(name, message.tensors[next++]).second) {
      f.fail("names the weight \"", name, "\" twice");
    }
  }
  if (p.role == "shard" && p.weights.empty()) f.fail("gives shard ", p.index, " no parameters");
  if (p.role == "worker") {
    if (!data) f.fail("gives worker ", p.index, " no data");
    p.inputs = message.tensors[next++];
    p.targets = message.tensors[next++];
    check_worker_package(p, f);
  }
  return p;
}

std::pair<Tensor, Tensor> ps_batch(const PsPackage& p, int64_t step) {
  const int64_t rows = p.inputs.size(0);
  const int64_t begin = (step * p.batch) % (rows - p.batch + 1);
  return {narrow(p.inputs, 0, begin, p.batch).contiguous(),
          narrow(p.targets, 0, begin, p.batch).contiguous()};
}

}  // namespace pipit
