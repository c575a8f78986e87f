#include "pipeline/remote/stage_package.h"

#include <algorithm>
#include <climits>

#include "autograd/grad_mode.h"
#include "codec/safetensors.h"
#include "nn/registry.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipeline/protocol/messages.h"
#include "serialize/checkpoint.h"

namespace pipit {
namespace {

using json = nlohmann::json;

constexpr const char* kFormat = "pipit-stage-package";
constexpr int kVersion = 6;

// The package's place in the pipeline, checked before anything indexes by it.
void check_layout(const StagePackage& package, const char* operation) {
  PIPIT_CHECK(package.stages >= 1 && package.chunks_per_stage >= 1, operation,
              ": stages and chunks_per_stage must be >= 1, got ", package.stages, " and ",
              package.chunks_per_stage);
  PIPIT_CHECK(int64_t{package.stages} * package.chunks_per_stage <= INT_MAX, operation, ": ",
              package.stages, " stages of ", package.chunks_per_stage,
              " chunks number their chunks beyond int");
  PIPIT_CHECK(package.stage >= 0 && package.stage < package.stages, operation, ": stage ",
              package.stage, " is outside [0, ", package.stages, ")");
  PIPIT_CHECK(package.replicas >= 1 && package.replicas <= kMaxReplicas &&
                  int64_t{package.stages} * package.replicas <= INT_MAX,
              operation, ": ", package.replicas, " replicas of ", package.stages,
              " stages are not a run's endpoints");
  PIPIT_CHECK(package.replica >= 0 && package.replica < package.replicas, operation, ": replica ",
              package.replica, " is outside [0, ", package.replicas, ")");
  PIPIT_CHECK(package.chunk_configs.size() == static_cast<size_t>(package.chunks_per_stage),
              operation, ": stage ", package.stage, " has ", package.chunk_configs.size(),
              " chunk configs but chunks_per_stage is ", package.chunks_per_stage);
}

}  // namespace

StagePackage make_stage_package(const Sequential& model, const std::vector<LayerRange>& ranges,
                                const PipelineConfig& config, int stage,
                                const StateDict& optimizer_state, int replica) {
  PIPIT_CHECK(stage >= 0 && stage < config.stages, "make_stage_package: stage ", stage,
              " is outside [0, ", config.stages, ")");
  PIPIT_CHECK(ranges.size() == static_cast<size_t>(config.stages * config.chunks_per_stage),
              "make_stage_package: ", ranges.size(), " layer ranges for ", config.stages,
              " stages of ", config.chunks_per_stage, " chunks");
  const StageSpec spec = make_stage_spec(model, ranges, config, stage, {}, replica);
  StagePackage package;
  package.stage = stage;
  package.stages = config.stages;
  package.replica = spec.replica;
  package.replicas = spec.replicas;
  package.shard_optimizer = spec.shard_optimizer;
  package.chunks_per_stage = config.chunks_per_stage;
  package.schedule = config.schedule;
  package.schedule_table = config.schedule_table;
  package.recompute = spec.recompute;
  package.max_deferred = spec.max_deferred;
  package.optimizer_config = config.optimizer;
  package.device = spec.device.str();
  package.compute_dtype = spec.compute_dtype;
  package.ties = spec.ties;
  for (const auto& chunk : spec.chunks) {
    package.chunk_configs.push_back(chunk->config());
    package.weights.merge(chunk->state_dict());
  }
  package.optimizer_state =
      optimizer_state_for(with_tied_copies(optimizer_state, spec.ties),
                          NamedParameters(package.weights.begin(), package.weights.end()));
  return package;
}

namespace {

// What the blob and the message both carry: the metadata (every value a string, as in
// safetensors) and the tensors, the weights under "model." and the optimizer state under
// "optim.".
struct PackageParts {
  json metadata;
  StateDict tensors;
};

PackageParts to_parts(const StagePackage& package, const char* caller) {
  check_layout(package, caller);
  json metadata = tagged_metadata(kFormat, kVersion);
  metadata["stage"] = std::to_string(package.stage);
  metadata["stages"] = std::to_string(package.stages);
  metadata["replica"] = std::to_string(package.replica);
  metadata["replicas"] = std::to_string(package.replicas);
  metadata["shard_optimizer"] = package.shard_optimizer ? "true" : "false";
  metadata["chunks_per_stage"] = std::to_string(package.chunks_per_stage);
  metadata["schedule"] = package.schedule;
  metadata["schedule_table"] = package.schedule_table;
  metadata["recompute"] = package.recompute ? "full" : "none";
  metadata["max_deferred"] = std::to_string(package.max_deferred);
  metadata["chunk_configs"] = json(package.chunk_configs).dump();
  metadata["optimizer_config"] = package.optimizer_config.dump();
  metadata["peers"] = package.peers.dump();
  metadata["device"] = package.device;
  metadata["compute_dtype"] = dtype_name(package.compute_dtype);
  json ties = json::array();
  for (const TiedParameter& tie : package.ties) {
    ties.push_back({{"source", tie.source},
                    {"copy", tie.copy},
                    {"source_stage", tie.source_stage},
                    {"copy_stage", tie.copy_stage}});
  }
  metadata["ties"] = ties.dump();
  StateDict tensors;
  add_prefixed(tensors, "model.", package.weights);
  add_prefixed(tensors, "optim.", package.optimizer_state);
  return {std::move(metadata), std::move(tensors)};
}

// The text at `key`, which must be `yes` or `no`; whether it is `yes`.
bool read_choice(const TaggedReader& reader, const std::string& key, const std::string& yes,
                 const std::string& no) {
  const std::string value = reader.text(key);
  if (value != yes && value != no) {
    reader.fail(key, "must be \"" + yes + "\" or \"" + no + "\", got \"" + value + "\"");
  }
  return value == yes;
}

// One entry of "ties": {source, copy, source_stage, copy_stage}, stages inside the pipeline,
// one of them this stage.
TiedParameter read_tie(const TaggedReader& reader, const json& tie, const StagePackage& package) {
  const bool valid = tie.is_object() && tie.size() == 4 && tie.contains("source") &&
                     tie["source"].is_string() && tie.contains("copy") && tie["copy"].is_string() &&
                     tie.contains("source_stage") && tie["source_stage"].is_number_integer() &&
                     tie.contains("copy_stage") && tie["copy_stage"].is_number_integer();
  if (!valid) {
    reader.fail("ties",
                "each tie must be {source, copy, source_stage, copy_stage}, got " + tie.dump());
  }
  TiedParameter parsed{tie["source"], tie["copy"], 0, 0};
  for (const char* key : {"source_stage", "copy_stage"}) {
    const json& stage = tie[key];
    if (stage.is_number_unsigned()
            ? stage.get<uint64_t>() >= uint64_t(package.stages)
            : (stage.get<int64_t>() < 0 || stage.get<int64_t>() >= package.stages)) {
      reader.fail("ties", std::string(key) + " " + stage.dump() + " is outside the pipeline");
    }
    (std::string(key) == "source_stage" ? parsed.source_stage : parsed.copy_stage) =
        stage.get<int>();
  }
  if (parsed.source_stage != package.stage && parsed.copy_stage != package.stage) {
    reader.fail("ties", "a tie of stages " + std::to_string(parsed.source_stage) + " and " +
                            std::to_string(parsed.copy_stage) + " is not this stage's");
  }
  return parsed;
}

// Every check of a received package, on its decoded parts.
StagePackage from_parts(json metadata, const StateDict& tensors, const std::string& source) {
  const TaggedReader reader(std::move(metadata), source, kFormat, kVersion, "pipit stage package");
  StagePackage package;
  package.stages = static_cast<int>(reader.integer("stages", 1, INT_MAX));
  package.stage = static_cast<int>(reader.integer("stage", 0, package.stages - 1));
  package.replicas = static_cast<int>(
      reader.integer("replicas", 1, std::min<int64_t>(kMaxReplicas, INT_MAX / package.stages)));
  package.replica = static_cast<int>(reader.integer("replica", 0, package.replicas - 1));
  package.shard_optimizer = read_choice(reader, "shard_optimizer", "true", "false");
  // Global chunk numbers (at most stages * chunks_per_stage - 1) must be ints.
  package.chunks_per_stage =
      static_cast<int>(reader.integer("chunks_per_stage", 1, INT_MAX / package.stages));
  package.schedule = reader.text("schedule");
  package.schedule_table = reader.text("schedule_table");
  package.recompute = !read_choice(reader, "recompute", "none", "full");
  package.max_deferred = static_cast<int>(reader.integer("max_deferred", 0, INT_MAX));
  const json chunks = reader.parse("chunk_configs");
  if (!chunks.is_array() || chunks.size() != static_cast<size_t>(package.chunks_per_stage)) {
    reader.fail("chunk_configs", "must be an array of chunks_per_stage = " +
                                     std::to_string(package.chunks_per_stage) +
                                     " module configs, got " + reader.text("chunk_configs"));
  }
  package.chunk_configs.assign(chunks.begin(), chunks.end());
  package.optimizer_config = reader.parse("optimizer_config");
  package.peers = reader.parse("peers");
  package.device = reader.text("device");
  try {
    Device::parse(package.device);
  } catch (const Error& e) {
    reader.fail("device", e.what());
  }
  try {
    package.compute_dtype = dtype_from_name(reader.text("compute_dtype"));
  } catch (const Error& e) {
    reader.fail("compute_dtype", e.what());
  }
  const json ties = reader.parse("ties");
  if (!ties.is_array()) reader.fail("ties", "must be an array, got " + reader.text("ties"));
  for (const json& tie : ties) package.ties.push_back(read_tie(reader, tie, package));
  std::vector<StateDict> groups = reader.split(tensors, {"model.", "optim."});
  package.weights = std::move(groups[0]);
  package.optimizer_state = std::move(groups[1]);
  return package;
}

}  // namespace

std::string encode_stage_package(const StagePackage& package) {
  const PackageParts parts = to_parts(package, "encode_stage_package");
  return encode_safetensors(parts.tensors, parts.metadata);
}

StagePackage decode_stage_package(const std::string& bytes, const std::string& source) {
  json metadata = json::object();
  const StateDict tensors = decode_safetensors(bytes.data(), bytes.size(), source, &metadata);
  return from_parts(std::move(metadata), tensors, source);
}

// On the wire a package travels as a StagePackage message: its tensors in the message's
// tensor list, their names and the metadata in meta, checked on receipt as the blob's are.
// The tensors are copied once, to the host as a blob's would be, so a package sent in-process
// shares no storage with the model.
Message stage_package_message(const StagePackage& package) {
  PackageParts parts = to_parts(package, "stage_package_message");
  Message message(PipelineKind::StagePackage, 0);
  message.meta = {{"metadata", std::move(parts.metadata)}, {"names", json::array()}};
  NoGradGuard no_grad;
  for (const auto& [name, tensor] : parts.tensors) {
    message.meta["names"].push_back(name);
    message.tensors.push_back(tensor.device().is_cpu() ? tensor.clone() : tensor.to(Device::cpu()));
  }
  return message;
}

StagePackage stage_package_from_message(const Message& message, const std::string& source) {
  const json& meta = message.meta;
  PIPIT_CHECK(meta.is_object() && meta.contains("metadata") && meta["metadata"].is_object() &&
                  meta.contains("names") && meta["names"].is_array() &&
                  meta["names"].size() == message.tensors.size(),
              source, ": a stage package message needs \"metadata\" and one name per tensor");
  StateDict tensors;
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    const json& name = meta["names"][i];
    PIPIT_CHECK(name.is_string(), source, ": tensor name ", i, " is not a string");
    PIPIT_CHECK(tensors.emplace(name.get<std::string>(), message.tensors[i]).second, source,
                ": tensor '", name.get<std::string>(), "' appears twice");
  }
  return from_parts(meta["metadata"], tensors, source);
}

StageSpec build_stage_spec(const StagePackage& package) {
  check_layout(package, "build_stage_spec");
  StageSpec spec;
  spec.stage = package.stage;
  spec.stages = package.stages;
  spec.replica = package.replica;
  spec.replicas = package.replicas;
  spec.shard_optimizer = package.shard_optimizer;
  spec.chunks_per_stage = package.chunks_per_stage;
  spec.schedule = package.schedule;
  spec.schedule_table = package.schedule_table;
  spec.recompute = package.recompute;
  spec.max_deferred = package.max_deferred;
  spec.optimizer = package.optimizer_config;
  spec.optimizer_state = package.optimizer_state;
  spec.device = Device::parse(package.device);
  spec.compute_dtype = package.compute_dtype;
  spec.ties = package.ties;
  StateDict unclaimed = package.weights;
  for (int local = 0; local < package.chunks_per_stage; ++local) {
    const int global =
        global_chunk(package.stage, local, package.stages, placement_of(package.schedule));
    try {
      std::shared_ptr<Module> module = build_module(package.chunk_configs[size_t(local)]);
      auto chunk = std::dynamic_pointer_cast<Sequential>(module);
      PIPIT_CHECK(chunk != nullptr, "the config builds a ", module->config().value("type", "?"),
                  ", not a Sequential");
      StateDict own;
      for (const auto& [name, parameter] : chunk->named_parameters()) {
        if (auto it = unclaimed.find(name); it != unclaimed.end()) {
          own.insert(unclaimed.extract(it));
        }
      }
      chunk->load_state_dict(own);  // strict: names the first missing or misshapen weight
      spec.chunks.push_back(std::move(chunk));
    } catch (const Error& e) {
      throw Error("build_stage_spec: stage " + std::to_string(package.stage) + " chunk " +
                  std::to_string(local) + " (global chunk " + std::to_string(global) +
                  "): " + e.what());
    }
  }
  PIPIT_CHECK(unclaimed.empty(), "build_stage_spec: stage ", package.stage, ": weight '",
              unclaimed.begin()->first, "' belongs to none of its chunks");
  return spec;
}

}  // namespace pipit
