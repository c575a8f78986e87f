#include "nn/sequential.h"

#include "nn/registry.h"

namespace pipit {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> layers, size_t first_index)
    : first_index_(first_index) {
  for (auto& layer : layers) push_back(std::move(layer));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& layer : layers_) h = layer->forward(h);
  return h;
}

json Sequential::config() const {
  json layers = json::array();
  for (const auto& layer : layers_) layers.push_back(layer->config());
  return {{"type", "Sequential"}, {"first_index", first_index_}, {"layers", layers}};
}

void Sequential::push_back(std::shared_ptr<Module> layer) {
  register_module(std::to_string(first_index_ + layers_.size()), layer);
  layers_.push_back(std::move(layer));
}

const std::shared_ptr<Module>& Sequential::operator[](size_t i) const {
  PIPIT_CHECK(i < layers_.size(), "Sequential: layer ", i, " out of range for ", layers_.size(),
              " layers");
  return layers_[i];
}

void Sequential::replace(size_t i, std::shared_ptr<Module> layer) {
  PIPIT_CHECK(i < layers_.size(), "Sequential::replace: layer ", i, " out of range for ",
              layers_.size(), " layers");
  replace_child(std::to_string(first_index_ + i), layer);
  layers_[i] = std::move(layer);
}

std::shared_ptr<Sequential> Sequential::slice(size_t begin, size_t end) const {
  PIPIT_CHECK(begin <= end && end <= layers_.size(), "Sequential::slice: [", begin, ", ", end,
              ") is not a range of ", layers_.size(), " layers");
  std::vector<std::shared_ptr<Module>> part(layers_.begin() + static_cast<ptrdiff_t>(begin),
                                            layers_.begin() + static_cast<ptrdiff_t>(end));
  auto out = std::make_shared<Sequential>(std::move(part), first_index_ + begin);
  out->train(is_training());
  return out;
}

}  // namespace pipit
