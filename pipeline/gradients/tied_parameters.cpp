#include "pipeline/gradients/tied_parameters.h"

#include "pipeline/schedules/task.h"

namespace pipit {
namespace {

size_t layer_of(const std::string& name) {
  return static_cast<size_t>(std::stoul(name.substr(0, name.find('.'))));
}

int stage_of_layer(size_t layer, const std::vector<LayerRange>& ranges,
                   const PipelineConfig& config) {
  for (size_t c = 0; c < ranges.size(); ++c) {
    if (layer >= ranges[c].begin && layer < ranges[c].end) {
      return stage_of_chunk(static_cast<int>(c), config.stages, placement_of(config.schedule));
    }
  }
  throw Error(detail::concat("tied parameters: layer ", layer, " is in no chunk"));
}

}  // namespace

std::vector<TiedParameter> tied_parameters(const Sequential& model,
                                           const std::vector<LayerRange>& ranges,
                                           const PipelineConfig& config) {
  std::vector<TiedParameter> ties;
  const int p = config.stages;
  for (const auto& [copy, source] : model.ties()) {
    TiedParameter tie{source, copy, stage_of_layer(layer_of(source), ranges, config),
                      stage_of_layer(layer_of(copy), ranges, config)};
    const int apart = (tie.copy_stage - tie.source_stage + p) % p;
    PIPIT_CHECK(apart == 0 || apart == 1 || apart == p - 1, "tied parameters: '", copy, "' (stage ",
                tie.copy_stage, ") is tied to '", source, "' (stage ", tie.source_stage,
                "), but only stages next to each other on the ring exchange ",
                "gradients; choose a partition that puts them on neighbouring stages");
    ties.push_back(tie);
  }
  return ties;
}

std::string remap_refusal(const Sequential& model) {
  if (model.ties().empty()) return "";
  const auto& [copy, source] = model.ties().front();
  return "the model ties '" + copy + "' to '" + source +
         "', and layers holding tied parameters do not move between stages yet";
}

StateDict with_tied_copies(StateDict optimizer_state, const std::vector<TiedParameter>& ties) {
  for (const TiedParameter& tie : ties) {
    const std::string prefix = tie.source + ".";
    StateDict copies;
    for (const auto& [key, value] : optimizer_state) {
      const bool entry = key.compare(0, prefix.size(), prefix) == 0 &&
                         key.find('.', prefix.size()) == std::string::npos;
      if (entry) copies[tie.copy + "." + key.substr(prefix.size())] = value;
    }
    optimizer_state.merge(copies);
  }
  return optimizer_state;
}

}  // namespace pipit
