// The stage package harnesses: a package as bytes (decode_stage_package) and as the frame a
// worker receives (a StagePackage message, stage_package_from_message). An accepted package
// must come back the same through bytes, through a message and through a frame, and is then
// built the way a worker builds its stage: build_stage_spec, then the Stage itself, which
// makes the optimizer and loads its state.
#include <optional>

#include "comm/local_communicator.h"
#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipeline/remote/stage_package.h"
#include "pipit.h"
#include "tests/fuzz/harness/check.h"
#include "tests/fuzz/harness/frame_input.h"

namespace pipit::fuzz {
namespace {

// The first field in which two packages differ, or empty.
std::string difference(const StagePackage& a, const StagePackage& b) {
  if (a.stage != b.stage || a.stages != b.stages || a.chunks_per_stage != b.chunks_per_stage) {
    return "stage, stages or chunks_per_stage";
  }
  if (a.schedule != b.schedule) return "schedule";
  if (a.chunk_configs != b.chunk_configs) return "chunk_configs";
  if (!same_tensors(a.weights, b.weights)) return "weights";
  if (a.optimizer_config != b.optimizer_config) return "optimizer_config";
  if (!same_tensors(a.optimizer_state, b.optimizer_state)) return "optimizer_state";
  if (a.peers != b.peers) return "peers";
  if (a.device != b.device) return "device";
  if (a.compute_dtype != b.compute_dtype) return "compute_dtype";
  return "";
}

void require_same(const StagePackage& back, const StagePackage& package, const char* through) {
  const std::string field = difference(back, package);
  require(field.empty(), std::string("a decoded stage package does not survive a round trip ") +
                             through + ": its " + field + " changed");
}

void check_accepted(const StagePackage& package) {
  must_not_throw("re-encoding a decoded stage package and decoding it again", [&] {
    require_same(decode_stage_package(encode_stage_package(package), "re-encoded"), package,
                 "through bytes");
    const Message message = stage_package_message(package);
    require_same(stage_package_from_message(message, "re-encoded"), package, "through a message");
    const std::string frame = encode_frame(message);
    const FrameHeader header = decode_frame_header(reinterpret_cast<const uint8_t*>(frame.data()));
    const std::string_view rest = std::string_view(frame).substr(kFrameHeaderSize);
    const Message received = decode_frame_payload(header, rest.substr(0, header.header_length),
                                                  rest.substr(header.header_length));
    require_same(stage_package_from_message(received, "re-encoded"), package, "through a frame");
  });
  refuses_only_with("building a stage from a decoded package", [&] {
    Stage stage(build_stage_spec(package), LocalHub::create()->endpoint(package.stage));
  });
}

}  // namespace

bool fuzz_stage_package(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::optional<StagePackage> package;
  refuses_only_with("decode_stage_package",
                    [&] { package = decode_stage_package(bytes, kSource); });
  if (!package) return false;
  check_accepted(*package);
  return true;
}

bool fuzz_stage_package_message(const uint8_t* data, size_t size) {
  const std::optional<FrameInput> frame = split_frame_input(data, size);
  if (!frame) return false;
  std::optional<Message> message;
  refuses_only_with<FrameError>("decode_frame_payload", [&] {
    message = decode_frame_payload(frame->header, frame->json, frame->body);
  });
  if (!message) return false;
  std::optional<StagePackage> package;
  refuses_only_with("stage_package_from_message",
                    [&] { package = stage_package_from_message(*message, kSource); });
  if (!package) return false;
  check_accepted(*package);
  return true;
}

namespace {

// Packages of every stage of a few small pipelines, the optimizer state after one step.
std::vector<StagePackage> seed_packages() {
  std::vector<StagePackage> packages;
  const auto add = [&](const std::shared_ptr<Sequential>& model, const Tensor& input,
                       PipelineConfig config, const std::vector<int>& stages) {
    auto optimizer = make_optimizer(config.optimizer, model->named_parameters());
    sum(model->forward(input)).backward();
    optimizer->step();
    const std::vector<LayerRange> ranges = partition_model(*model, config);
    for (int s : stages) {
      StagePackage package = make_stage_package(*model, ranges, config, s, optimizer->state_dict());
      package.peers = {{"0", "127.0.0.1:7001"}, {"1", "127.0.0.1:7002"}};
      packages.push_back(std::move(package));
    }
  };
  Generator init(11);
  add(mlp({3, 4, 2}, "relu", &init), ones({2, 3}),
      {.stages = 2, .microbatches = 2, .optimizer = {{"type", "SGD"}, {"lr", 0.1}}}, {0, 1});
  // GPT-2's tied head: stage 1 holds the head's copy of the embedding (the package's ties).
  GptConfig tied{5, 4, 2, 1, 4, 0.0};
  tied.tie_embeddings = true;
  tied.head_bias = false;
  add(gpt(tied, &init), from_vector<int64_t>({1, 2, 3, 4}, {1, 4}),
      {.stages = 2, .microbatches = 2, .chunks_per_stage = 2, .schedule = "interleaved"}, {1});
  return packages;
}

}  // namespace

std::vector<std::string> stage_package_seeds() {
  std::vector<std::string> seeds;
  for (const StagePackage& package : seed_packages()) {
    seeds.push_back(encode_stage_package(package));
  }
  return seeds;
}

std::vector<std::string> stage_package_message_seeds() {
  std::vector<std::string> seeds;
  for (const StagePackage& package : seed_packages()) {
    seeds.push_back(encode_frame(stage_package_message(package)));
  }
  return seeds;
}

}  // namespace pipit::fuzz
