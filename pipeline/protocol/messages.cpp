#include "pipeline/protocol/messages.h"

#include <limits>

namespace pipit {
namespace {

using json = nlohmann::json;
using Fields = JsonFields<ControlError>;

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// A field holding a list of names (weights, optimizer entries).
std::vector<std::string> read_names(Fields& f, const char* list) {
  return f.strings(list, kMaxControlList, kMaxControlString);
}

}  // namespace

bool register_pipeline_message_kinds() {
  using K = PipelineKind;
  return register_message_kinds({
      {K::StepBegin, "StepBegin", "pipeline", true},
      {K::OptimizerStep, "OptimizerStep", "pipeline", true},
      {K::Abort, "Abort", "pipeline", true},
      {K::FetchState, "FetchState", "pipeline", true},
      {K::Activation, "Activation", "pipeline"},
      {K::Gradient, "Gradient", "pipeline"},
      {K::StageDone, "StageDone", "pipeline"},
      {K::OptimizerDone, "OptimizerDone", "pipeline"},
      {K::StagePackage, "StagePackage", "pipeline", true},
      {K::RemapPrepare, "RemapPrepare", "pipeline", true},
      {K::LayerTransfer, "LayerTransfer", "pipeline"},
      {K::RemapReady, "RemapReady", "pipeline"},
      {K::RemapCommit, "RemapCommit", "pipeline", true},
      {K::RemapDone, "RemapDone", "pipeline"},
      {K::TiedGradient, "TiedGradient", "pipeline"},
      {K::GenerateBegin, "GenerateBegin", "pipeline", true},
      {K::GenerateStep, "GenerateStep", "pipeline"},
      {K::GenerateEnd, "GenerateEnd", "pipeline", true},
      {K::ParameterShard, "ParameterShard", "pipeline"},
  });
}

Message to_message(const StepBegin& b, int64_t step) {
  return control_message(PipelineKind::StepBegin, step,
                         {{"train", b.train},
                          {"microbatches", b.microbatches},
                          {"trace", b.trace},
                          {"grad_norm", b.grad_norm},
                          {"profile", b.profile}});
}

Message to_message(const OptimizerStep& o, int64_t step) {
  json meta = {{"grad_scale", o.grad_scale}, {"skip", o.skip}};
  if (o.lr) meta["lr"] = *o.lr;
  return control_message(PipelineKind::OptimizerStep, step, std::move(meta));
}

Message to_message(const StageDone& d, int64_t step) {
  json trace = json::array();
  for (const TaskTiming& t : d.trace) {
    trace.push_back({t.microbatch, t.chunk, t.phase, t.start_us, t.end_us});
  }
  json layers = json::array();
  for (const LayerTiming& l : d.layers) {
    layers.push_back({l.layer, l.forward_us, l.backward_us, l.output_bytes, l.state_bytes});
  }
  json meta = {{"peak_stashed", d.peak_stashed},
               {"peak_deferred", d.peak_deferred},
               {"trace", std::move(trace)},
               {"chunk_busy_us", d.chunk_busy_us},
               {"layers", std::move(layers)}};
  if (d.grad_norm_sq) meta["grad_norm_sq"] = *d.grad_norm_sq;
  return control_message(PipelineKind::StageDone, step, std::move(meta));
}

Message to_message(const RemapPrepare& r, int64_t step) {
  return control_message(PipelineKind::RemapPrepare, step, {{"from", r.from}, {"to", r.to}});
}

Message to_message(const LayerTransfer& t, int64_t step, int chunk, std::vector<Tensor> tensors) {
  json layers = json::array();
  for (const LayerTransfer::Layer& layer : t.layers) {
    layers.push_back({{"index", layer.index},
                      {"config", layer.config},
                      {"weights", layer.weights},
                      {"optimizer", layer.optimizer}});
  }
  Message message = control_message(PipelineKind::LayerTransfer, step,
                                    {{"from_chunk", t.from_chunk}, {"layers", std::move(layers)}});
  message.chunk = chunk;
  message.tensors = std::move(tensors);
  return message;
}

StepBegin read_step_begin(const Message& message) {
  Fields f = control_fields(message, PipelineKind::StepBegin);
  StepBegin b;
  b.train = f.boolean("train");
  b.microbatches = static_cast<int>(f.integer("microbatches", 1, kMaxMicrobatches));
  b.trace = f.boolean("trace");
  b.grad_norm = f.boolean("grad_norm");
  b.profile = f.boolean("profile");
  f.done();
  return b;
}

OptimizerStep read_optimizer_step(const Message& message) {
  Fields f = control_fields(message, PipelineKind::OptimizerStep);
  OptimizerStep o;
  o.grad_scale = f.number("grad_scale");
  o.skip = f.boolean("skip");
  if (f.has("lr")) o.lr = f.number("lr");
  f.done();
  return o;
}

StageDone read_stage_done(const Message& message) {
  Fields f = control_fields(message, PipelineKind::StageDone);
  StageDone d;
  d.peak_stashed = f.integer("peak_stashed", 0, std::numeric_limits<int64_t>::max());
  d.peak_deferred = f.integer("peak_deferred", 0, std::numeric_limits<int64_t>::max());
  if (f.has("grad_norm_sq")) d.grad_norm_sq = f.number("grad_norm_sq");
  for (const json& event : f.array("trace", kMaxControlList)) {
    if (!event.is_array() || event.size() != 5 || !event[0].is_number_integer() ||
        !event[1].is_number_integer() || !event[2].is_number_integer() || !event[3].is_number() ||
        !event[4].is_number()) {
      f.fail("field \"trace\" has the entry ", event.dump(),
             ", not [microbatch, chunk, phase, start_us, end_us]");
    }
    const int64_t microbatch = event[0].get<int64_t>(), chunk = event[1].get<int64_t>(),
                  phase = event[2].get<int64_t>();
    if (microbatch < 0 || microbatch > kIntMax || chunk < 0 || chunk > kIntMax || phase < 0 ||
        phase > 5) {
      f.fail("field \"trace\" has the out-of-range entry ", event.dump());
    }
    d.trace.push_back({static_cast<int>(microbatch), static_cast<int>(chunk),
                       static_cast<int>(phase), event[3].get<double>(), event[4].get<double>()});
  }
  for (const json& busy : f.array("chunk_busy_us", kMaxControlList)) {
    if (!busy.is_number() || busy.get<double>() < 0) {
      f.fail("field \"chunk_busy_us\" has the entry ", busy.dump(), ", not a time >= 0");
    }
    d.chunk_busy_us.push_back(busy.get<double>());
  }
  for (const json& layer : f.array("layers", kMaxControlList)) {
    bool valid = layer.is_array() && layer.size() == 5 && layer[0].is_number_integer() &&
                 layer[0].get<int64_t>() >= 0;
    for (size_t i = 1; valid && i < 5; ++i) valid = layer[i].is_number() && layer[i] >= 0;
    if (!valid) {
      f.fail("field \"layers\" has the entry ", layer.dump(),
             ", not [layer, forward_us, backward_us, output_bytes, state_bytes]");
    }
    d.layers.push_back({layer[0].get<int64_t>(), layer[1].get<double>(), layer[2].get<double>(),
                        layer[3].get<double>(), layer[4].get<double>()});
  }
  f.done();
  return d;
}

RemapPrepare read_remap_prepare(const Message& message) {
  Fields f = control_fields(message, PipelineKind::RemapPrepare);
  RemapPrepare r;
  for (const char* list : {"from", "to"}) {
    std::vector<int64_t>& counts = list[0] == 'f' ? r.from : r.to;
    for (const json& count : f.array(list, kMaxControlList)) {
      if (!count.is_number_integer() || count.get<int64_t>() < 1 ||
          count.get<int64_t>() > static_cast<int64_t>(kMaxControlList)) {
        f.fail("field \"", list, "\" has the entry ", count.dump(), ", not a layer count in [1, ",
               kMaxControlList, "]");
      }
      counts.push_back(count.get<int64_t>());
    }
  }
  f.done();
  if (r.from.size() != r.to.size()) {
    f.fail("has ", r.from.size(), " chunks before and ", r.to.size(), " after");
  }
  return r;
}

LayerTransfer read_layer_transfer(const Message& message) {
  Fields f = control_fields(message, PipelineKind::LayerTransfer);
  LayerTransfer t;
  t.from_chunk = static_cast<int>(f.integer("from_chunk", 0, kIntMax));
  size_t tensors = 0;
  for (const json& entry : f.array("layers", kMaxControlList)) {
    Fields layer(entry, std::string("LayerTransfer message: a layer"));
    LayerTransfer::Layer& out = t.layers.emplace_back();
    out.index = layer.integer("index", 0, std::numeric_limits<int64_t>::max());
    out.config = layer.object("config");
    out.weights = read_names(layer, "weights");
    out.optimizer = read_names(layer, "optimizer");
    tensors += out.weights.size() + out.optimizer.size();
    layer.done();
  }
  f.done();
  if (tensors != message.tensors.size()) {
    f.fail("names ", tensors, " tensors but carries ", message.tensors.size());
  }
  return t;
}

}  // namespace pipit
