#pragma once
// LayerMigration: one stage's part of a remap (Coordinator::remap), between two steps.
//
// Layers move between neighbouring chunks only, one boundary at a time: a layer going from
// chunk 1 to chunk 3 travels 1 -> 2 -> 3, relayed by chunk 2's stage without being installed
// there. So a remap needs no connections beyond the ones activations already use, and any
// contiguous partition can be reached from any other. What moves with a layer: its config,
// its weights and its optimizer entries (Adam moments, SGD momentum), byte for byte; the
// optimizer's step count is the same on every stage and stays.
//
// Nothing the stage trains with changes until the stage commits: build() makes the new
// chunks aside, so a remap abandoned before commit leaves the old partition in place.
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "nn/sequential.h"
#include "optim/optimizer.h"
#include "pipeline/partition.h"
#include "pipeline/protocol/messages.h"

namespace pipit {

class LayerMigration {
 public:
  // `chunks` are the stage's current chunks (local chunk l is global chunk l * p + stage),
  // whose layers must be the `from` ranges; `optimizer_state` (Optimizer::state_dict's form)
  // holds their state.
  LayerMigration(int stage, int stages, std::vector<LayerRange> from, std::vector<LayerRange> to,
                 const std::vector<std::shared_ptr<Sequential>>& chunks, StateDict optimizer_state);

  // Takes in a LayerTransfer for one of this stage's chunks, from the neighbouring chunk.
  void receive(const Message& transfer);
  // The transfers that can go out now, each with its destination stage. A transfer between
  // two chunks of this stage (one stage, or v > 1 with p = 1) is applied here instead.
  std::vector<std::pair<int, Message>> take_ready_transfers(int64_t step);
  // Every layer of the new chunks is here and every transfer went out.
  bool complete() const;

  struct Result {
    std::vector<std::shared_ptr<Sequential>> chunks;  // the new local chunks, in order
    StateDict optimizer_state;  // "step" and the entries of every parameter of `chunks`
  };
  // The new chunks: layers kept are the same modules; layers received are rebuilt from their
  // config and weights on `device`. Call once complete().
  Result build(Device device) const;

 private:
  // A layer on its way: the module itself while this stage still has it, or what a
  // neighbour sent.
  struct Layer {
    std::shared_ptr<Module> module;
    LayerTransfer::Layer description;
    std::vector<Tensor> tensors;  // the description's weights, then its optimizer entries
  };
  int chunk_of(const std::vector<LayerRange>& ranges, size_t layer) const;
  bool mine(int chunk) const { return chunk % stages_ == stage_; }
  // The layers that cross from `chunk` to its neighbour `to_chunk`.
  std::vector<size_t> crossing(int chunk, int to_chunk) const;
  Message encode(int chunk, int to_chunk, const std::vector<size_t>& layers, int64_t step);
  void accept(int chunk, const LayerTransfer& transfer, const std::vector<Tensor>& tensors);

  int stage_, stages_;
  std::vector<LayerRange> from_, to_;
  StateDict optimizer_state_;
  // The layers in this stage's hands, by global chunk and then layer index.
  std::map<int, std::map<size_t, Layer>> held_;
  // Outgoing boundaries (chunk, neighbour) still to send.
  std::vector<std::pair<int, int>> pending_;
};

}  // namespace pipit
