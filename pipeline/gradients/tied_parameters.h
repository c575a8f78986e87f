#pragma once
// Tied parameters in a pipeline (Megatron's embedding group): a model's tie (Sequential::tie,
// GPT-2's head to its token embedding) may join layers on different stages. Each stage then
// holds its own copy: the pipeline cuts the model with Sequential::untied_slice. After the
// last backward of a step the stages holding the two sides exchange their gradients, and both
// take source's + copy's (one addition of the same two tensors: the same bits on both), so the
// same optimizer update keeps the copies equal. On one stage the two are summed in place. The
// source's stage alone counts it in the gradient norm and reports it in fetch_state, so
// checkpoints hold it once, as the model does. The result is that of sequential gradient
// accumulation on the untied model with the two sides' sums added before the optimizer step,
// however the model is partitioned.
#include <string>
#include <vector>

#include "nn/sequential.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline_config.h"
#include "tensor/state_dict.h"

namespace pipit {

struct TiedParameter {
  std::string source, copy;  // full-model names: "0.tokens.weight" and "5.weight"
  int source_stage = 0, copy_stage = 0;
  bool operator==(const TiedParameter&) const = default;
};

// The model's ties placed on the stages `ranges` gives their layers. Two stages exchange
// gradients directly, so they must be neighbours on the stages' ring (as over TCP, where each
// stage connects to the next and the previous, the last to the first) or the same stage; an
// Error names the tie otherwise.
std::vector<TiedParameter> tied_parameters(const Sequential& model,
                                           const std::vector<LayerRange>& ranges,
                                           const PipelineConfig& config);

// Why a pipeline over `model` cannot move layers between stages (remap, rebalancing): its ties'
// copies stay on the stages the pipeline put them on. Empty when the model has no ties.
std::string remap_refusal(const Sequential& model);

// `optimizer_state` with each tie's source entries ("<source>.<buffer>") also under its copy's
// name, so the stage holding the copy restores the same state as the source's.
StateDict with_tied_copies(StateDict optimizer_state, const std::vector<TiedParameter>& ties);

}  // namespace pipit
