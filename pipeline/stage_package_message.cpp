#include "pipeline/stage_package.h"
#include "serialize/safetensors.h"

namespace pipit {

// On the wire a package travels as a StagePackage message: its tensors in the message's
// tensor list, their names and the package metadata in meta. The receiver reassembles the
// blob, so every check of decode_stage_package applies to what came over the network.
Message stage_package_message(const StagePackage& package) {
  const std::string bytes = encode_stage_package(package);
  nlohmann::json metadata = nlohmann::json::object();
  const StateDict tensors =
      decode_safetensors(bytes.data(), bytes.size(), "stage package", &metadata);
  Message message(MessageKind::StagePackage, 0);
  message.meta = {{"metadata", metadata}, {"names", nlohmann::json::array()}};
  for (const auto& [name, tensor] : tensors) {
    message.meta["names"].push_back(name);
    message.tensors.push_back(tensor);
  }
  return message;
}

StagePackage stage_package_from_message(const Message& message, const std::string& source) {
  const nlohmann::json& meta = message.meta;
  PIPIT_CHECK(meta.is_object() && meta.contains("metadata") && meta["metadata"].is_object() &&
                  meta.contains("names") && meta["names"].is_array() &&
                  meta["names"].size() == message.tensors.size(),
              source, ": a stage package message needs \"metadata\" and one name per tensor");
  StateDict tensors;
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    PIPIT_CHECK(meta["names"][i].is_string(), source, ": tensor name ", i, " is not a string");
    tensors[meta["names"][i].get<std::string>()] = message.tensors[i];
  }
  return decode_stage_package(encode_safetensors(tensors, meta["metadata"]), source);
}

}  // namespace pipit
