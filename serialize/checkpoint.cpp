#include "serialize/checkpoint.h"

#include <limits>

#include "codec/json_depth.h"
#include "codec/safetensors.h"
#include "tensor/error.h"

namespace pipit {
namespace {

using json = nlohmann::json;

constexpr const char* kFormat = "pipit-checkpoint";
constexpr int kVersion = 1;
constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

}  // namespace

void add_prefixed(StateDict& out, const std::string& prefix, const StateDict& group) {
  for (const auto& [name, tensor] : group) out[prefix + name] = tensor;
}

json tagged_metadata(const std::string& format, int version) {
  return {{"format", format}, {"version", std::to_string(version)}};
}

TaggedReader::TaggedReader(json metadata, std::string source, const std::string& format,
                           int version, std::string noun)
    : metadata_(std::move(metadata)), source_(std::move(source)), noun_(std::move(noun)) {
  const bool has_tag = metadata_.is_object() && metadata_.contains("format");
  PIPIT_CHECK(has_tag && metadata_["format"] == format, "'", source_, "' is not a ", noun_,
              ": its __metadata__ \"format\" is ",
              has_tag ? metadata_["format"].dump() : std::string("missing"), ", expected \"",
              format, "\"");
  const int64_t found = integer("version", 1, kMaxInt);
  if (found != version) {
    fail("version", "is " + std::to_string(found) + ", but this build reads only version " +
                        std::to_string(version));
  }
}

std::string TaggedReader::where() const {
  return noun_ + " '" + source_ + "': ";
}

void TaggedReader::fail(const std::string& key, const std::string& why) const {
  throw Error(where() + "metadata \"" + key + "\" " + why);
}

const std::string& TaggedReader::text(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) fail(key, "is missing");
  if (!it->is_string()) fail(key, "is not a string");
  return it->get_ref<const std::string&>();
}

json TaggedReader::parse(const std::string& key) const {
  const std::string& value = text(key);
  try {
    check_json_nesting(value, "");
  } catch (const Error& e) {
    fail(key, e.what());
  }
  try {
    return json::parse(value);
  } catch (const json::exception& e) {
    fail(key, std::string("is not valid JSON: ") + e.what());
  }
}

int64_t TaggedReader::integer(const std::string& key, int64_t min, int64_t max) const {
  const json value = parse(key);
  // Non-negative integers parse as unsigned; those past int64 would wrap in get<int64_t>.
  const bool is_int64 = value.is_number_unsigned() ? value.get<uint64_t>() <= uint64_t(kMaxInt)
                                                   : value.is_number_integer();
  if (!is_int64) fail(key, "must be a 64-bit integer, got '" + text(key) + "'");
  const int64_t n = value.get<int64_t>();
  if (n < min || n > max) {
    fail(key, "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " +
                  std::to_string(n));
  }
  return n;
}

uint64_t TaggedReader::unsigned_integer(const std::string& key) const {
  const json value = parse(key);
  if (!value.is_number_unsigned()) {
    fail(key, "must be an unsigned 64-bit integer, got '" + text(key) + "'");
  }
  return value.get<uint64_t>();
}

std::vector<StateDict> TaggedReader::split(const StateDict& tensors,
                                           const std::vector<std::string>& prefixes) const {
  std::vector<StateDict> groups(prefixes.size());
  for (const auto& [name, tensor] : tensors) {
    size_t group = 0;
    while (group < prefixes.size() && !name.starts_with(prefixes[group])) ++group;
    if (group == prefixes.size()) {
      std::string expected;
      for (const std::string& prefix : prefixes) expected += " '" + prefix + "'";
      throw Error(where() + "tensor '" + name + "' has none of the name prefixes" + expected);
    }
    groups[group][name.substr(prefixes[group].size())] = tensor;
  }
  return groups;
}

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint,
                     const ByteProgress& on_progress) {
  // Refused here rather than when loading, when the run that could fix it is gone.
  PIPIT_CHECK(checkpoint.model_config.is_object(), "save_checkpoint '", path,
              "': model_config must be a module config object, got ",
              checkpoint.model_config.dump());
  PIPIT_CHECK(checkpoint.step >= 0, "save_checkpoint '", path, "': step must be >= 0, got ",
              checkpoint.step);
  json metadata = tagged_metadata(kFormat, kVersion);
  metadata["model_config"] = checkpoint.model_config.dump();
  metadata["optimizer_config"] = checkpoint.optimizer_config.dump();
  metadata["step"] = std::to_string(checkpoint.step);
  metadata["rng_seed"] = std::to_string(checkpoint.rng_seed);
  metadata["rng_offset"] = std::to_string(checkpoint.rng_offset);
  metadata["extra"] = checkpoint.extra.dump();
  if (!checkpoint.grad_scaler.is_null()) metadata["grad_scaler"] = checkpoint.grad_scaler.dump();
  StateDict tensors;
  add_prefixed(tensors, "model.", checkpoint.weights);
  add_prefixed(tensors, "optim.", checkpoint.optimizer_state);
  save_safetensors(path, tensors, metadata, on_progress);
}

Checkpoint load_checkpoint(const std::string& path, const ByteProgress& on_progress) {
  json metadata = json::object();
  const StateDict tensors = load_safetensors(path, &metadata, on_progress);
  const TaggedReader reader(std::move(metadata), path, kFormat, kVersion, "pipit checkpoint");
  Checkpoint checkpoint;
  checkpoint.model_config = reader.parse("model_config");
  if (!checkpoint.model_config.is_object()) {
    reader.fail("model_config",
                "must be a module config object, got " + reader.text("model_config"));
  }
  checkpoint.optimizer_config = reader.parse("optimizer_config");
  checkpoint.step = reader.integer("step", 0, kMaxInt);
  checkpoint.rng_seed = reader.unsigned_integer("rng_seed");
  checkpoint.rng_offset = reader.unsigned_integer("rng_offset");
  checkpoint.extra = reader.parse("extra");
  if (reader.has("grad_scaler")) {
    checkpoint.grad_scaler = reader.parse("grad_scaler");
    if (!checkpoint.grad_scaler.is_object()) {
      reader.fail("grad_scaler",
                  "must be a GradScaler state object, got " + reader.text("grad_scaler"));
    }
  }
  std::vector<StateDict> groups = reader.split(tensors, {"model.", "optim."});
  checkpoint.weights = std::move(groups[0]);
  checkpoint.optimizer_state = std::move(groups[1]);
  return checkpoint;
}

}  // namespace pipit
