#include "pipeline/rebalancing/layer_migration.h"

#include <algorithm>

#include "nn/registry.h"

namespace pipit {
namespace {

std::string layer_prefix(size_t layer) {
  return std::to_string(layer) + ".";
}

// "{3, 4, 5}": for errors.
std::string layer_list(const std::vector<size_t>& layers) {
  std::string text;
  for (size_t l : layers) text += (text.empty() ? "{" : ", ") + std::to_string(l);
  return text.empty() ? "{}" : text + "}";
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

LayerMigration::LayerMigration(int stage, int stages, std::vector<LayerRange> from,
                               std::vector<LayerRange> to,
                               const std::vector<std::shared_ptr<Sequential>>& chunks,
                               StateDict optimizer_state)
    : stage_(stage),
      stages_(stages),
      from_(std::move(from)),
      to_(std::move(to)),
      optimizer_state_(std::move(optimizer_state)) {
  const int chunk_count = static_cast<int>(from_.size());
  PIPIT_CHECK(to_.size() == from_.size() && chunk_count % stages_ == 0 &&
                  static_cast<int>(chunks.size()) == chunk_count / stages_,
              "remap: stage ", stage_, " holds ", chunks.size(), " chunks, but the remap moves ",
              from_.size(), " chunks over ", stages_, " stages");
  for (size_t local = 0; local < chunks.size(); ++local) {
    const int c = static_cast<int>(local) * stages_ + stage_;
    const LayerRange& range = from_[static_cast<size_t>(c)];
    const Sequential& chunk = *chunks[local];
    PIPIT_CHECK(chunk.first_index() == range.begin && chunk.size() == range.end - range.begin,
                "remap: stage ", stage_, " holds layers [", chunk.first_index(), ", ",
                chunk.first_index() + chunk.size(), ") as chunk ", c, ", not [", range.begin, ", ",
                range.end, ") as the remap says");
    for (size_t i = 0; i < chunk.size(); ++i) held_[c][range.begin + i].module = chunk[i];
  }
  for (int c = 0; c < chunk_count; ++c) {
    if (!mine(c)) continue;
    for (int d : {c - 1, c + 1}) {
      if (d >= 0 && d < chunk_count && !crossing(c, d).empty()) pending_.emplace_back(c, d);
    }
  }
}

int LayerMigration::chunk_of(const std::vector<LayerRange>& ranges, size_t layer) const {
  const auto it = std::upper_bound(ranges.begin(), ranges.end(), layer,
                                   [](size_t l, const LayerRange& r) { return l < r.end; });
  return static_cast<int>(it - ranges.begin());
}

std::vector<size_t> LayerMigration::crossing(int chunk, int to_chunk) const {
  std::vector<size_t> layers;
  const size_t total = to_.back().end;
  for (size_t l = 0; l < total; ++l) {
    const int before = chunk_of(from_, l), after = chunk_of(to_, l);
    const bool leftward = to_chunk < chunk && after <= to_chunk && before >= chunk;
    const bool rightward = to_chunk > chunk && before <= chunk && after >= to_chunk;
    if (leftward || rightward) layers.push_back(l);
  }
  return layers;
}

Message LayerMigration::encode(int chunk, int to_chunk, const std::vector<size_t>& layers,
                               int64_t step) {
  LayerTransfer transfer;
  transfer.from_chunk = chunk;
  std::vector<Tensor> tensors;
  std::map<size_t, Layer>& held = held_[chunk];
  for (size_t l : layers) {
    Layer layer = std::move(held.at(l));
    held.erase(l);
    if (layer.module) {
      LayerTransfer::Layer& d = layer.description;
      d.index = static_cast<int64_t>(l);
      d.config = layer.module->config();
      for (const auto& [name, value] : layer.module->state_dict()) {
        d.weights.push_back(layer_prefix(l) + name);
        layer.tensors.push_back(value.detach().to(Device::cpu()));
      }
      for (const auto& [name, value] : optimizer_state_) {
        if (!starts_with(name, layer_prefix(l))) continue;
        d.optimizer.push_back(name);
        layer.tensors.push_back(value.detach().to(Device::cpu()));
      }
    }
    transfer.layers.push_back(std::move(layer.description));
    for (Tensor& t : layer.tensors) tensors.push_back(std::move(t));
  }
  return to_message(transfer, step, to_chunk, std::move(tensors));
}

void LayerMigration::accept(int chunk, const LayerTransfer& transfer,
                            const std::vector<Tensor>& tensors) {
  PIPIT_CHECK(chunk >= 0 && chunk < static_cast<int>(to_.size()) && mine(chunk) &&
                  std::abs(transfer.from_chunk - chunk) == 1,
              "remap: stage ", stage_, " got layers for chunk ", chunk, " from chunk ",
              transfer.from_chunk, ", which are not neighbouring chunks of this stage");
  const std::vector<size_t> expected = crossing(transfer.from_chunk, chunk);
  std::vector<size_t> got;
  size_t at = 0;
  for (const LayerTransfer::Layer& description : transfer.layers) {
    const auto l = static_cast<size_t>(description.index);
    got.push_back(l);
    PIPIT_CHECK(!held_[chunk].count(l), "remap: stage ", stage_, " got layer ", l, " for chunk ",
                chunk, " twice");
    Layer& layer = held_[chunk][l];
    layer.description = description;
    const size_t count = description.weights.size() + description.optimizer.size();
    layer.tensors.assign(tensors.begin() + static_cast<ptrdiff_t>(at),
                         tensors.begin() + static_cast<ptrdiff_t>(at + count));
    at += count;
    for (const std::string& name : description.weights) {
      PIPIT_CHECK(starts_with(name, layer_prefix(l)), "remap: layer ", l,
                  " arrived with the weight '", name, "' of another layer");
    }
    for (const std::string& name : description.optimizer) {
      PIPIT_CHECK(starts_with(name, layer_prefix(l)), "remap: layer ", l,
                  " arrived with the optimizer entry '", name, "' of another layer");
    }
  }
  PIPIT_CHECK(got == expected, "remap: chunk ", chunk, " expected layers ", layer_list(expected),
              " from chunk ", transfer.from_chunk, " and got ", layer_list(got));
}

void LayerMigration::receive(const Message& message) {
  accept(message.chunk, read_layer_transfer(message), message.tensors);
}

std::vector<std::pair<int, Message>> LayerMigration::take_ready_transfers(int64_t step) {
  std::vector<std::pair<int, Message>> out;
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t i = 0; i < pending_.size(); ++i) {
      const int c = pending_[i].first, d = pending_[i].second;
      const std::vector<size_t> layers = crossing(c, d);
      const bool ready = std::all_of(layers.begin(), layers.end(),
                                     [&](size_t l) { return held_[c].count(l) > 0; });
      if (!ready) continue;
      Message message = encode(c, d, layers, step);
      pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(i));
      progress = true;
      if (mine(d)) {
        accept(d, read_layer_transfer(message), message.tensors);
      } else {
        out.emplace_back(d % stages_, std::move(message));
      }
      break;
    }
  }
  return out;
}

bool LayerMigration::complete() const {
  if (!pending_.empty()) return false;
  for (int c = stage_; c < static_cast<int>(to_.size()); c += stages_) {
    const auto held = held_.find(c);
    const size_t want = to_[static_cast<size_t>(c)].end - to_[static_cast<size_t>(c)].begin;
    if (held == held_.end() || held->second.size() != want ||
        held->second.begin()->first != to_[static_cast<size_t>(c)].begin) {
      return false;
    }
  }
  return true;
}

LayerMigration::Result LayerMigration::build(Device device) const {
  PIPIT_CHECK(complete(), "remap: stage ", stage_, " is still missing layers");
  Result result;
  result.optimizer_state = optimizer_state_;
  for (int c = stage_; c < static_cast<int>(to_.size()); c += stages_) {
    const LayerRange& range = to_[static_cast<size_t>(c)];
    std::vector<std::shared_ptr<Module>> modules;
    for (const auto& [l, layer] : held_.at(c)) {
      if (layer.module) {
        modules.push_back(layer.module);
        continue;
      }
      const LayerTransfer::Layer& d = layer.description;
      std::shared_ptr<Module> module;
      try {
        module = build_module(d.config);
        StateDict weights;
        for (size_t i = 0; i < d.weights.size(); ++i) {
          weights[d.weights[i].substr(layer_prefix(l).size())] = layer.tensors[i].to(Device::cpu());
        }
        module->load_state_dict(weights);
      } catch (const Error& e) {
        throw Error(
            detail::concat("remap: stage ", stage_, " cannot rebuild layer ", l, ": ", e.what()));
      }
      module->to(device);
      for (size_t i = 0; i < d.optimizer.size(); ++i) {
        result.optimizer_state[d.optimizer[i]] = layer.tensors[d.weights.size() + i];
      }
      modules.push_back(std::move(module));
    }
    result.chunks.push_back(std::make_shared<Sequential>(std::move(modules), range.begin));
  }
  return result;
}

}  // namespace pipit
