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
  json out = {{"type", "Sequential"}, {"first_index", first_index_}, {"layers", layers}};
  if (!ties_.empty()) {
    out["ties"] = json::array();
    for (const auto& [parameter, tied_to] : ties_) out["ties"].push_back({parameter, tied_to});
  }
  return out;
}

size_t Sequential::layer_of(const std::string& name) const {
  const size_t dot = name.find('.');
  const std::string index = name.substr(0, dot);
  size_t i = 0;
  const bool numeric = !index.empty() && index.size() <= 9 &&
                       index.find_first_not_of("0123456789") == std::string::npos;
  if (numeric) i = std::stoul(index);
  PIPIT_CHECK(
      numeric && dot != std::string::npos && i >= first_index_ && i - first_index_ < layers_.size(),
      "Sequential: '", name, "' names no parameter of layers ", first_index_, "..",
      first_index_ + layers_.size() - 1);
  return i - first_index_;
}

void Sequential::tie(const std::string& parameter, const std::string& tied_to) {
  PIPIT_CHECK(parameter != tied_to, "Sequential::tie: '", parameter, "' is tied to itself");
  layer_of(parameter);
  layer_of(tied_to);
  Tensor source;
  for (const auto& [name, p] : named_parameters()) {
    if (name == tied_to) source = p;
  }
  PIPIT_CHECK(source.defined(), "Sequential::tie: no parameter '", tied_to, "' to tie '", parameter,
              "' to");
  tie_parameter(parameter, source);
  ties_.emplace_back(parameter, tied_to);
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
  if (layer == layers_[i]) return;
  for (const auto& [parameter, tied_to] : ties_) {
    PIPIT_CHECK(layer_of(parameter) != i && layer_of(tied_to) != i, "Sequential::replace: layer ",
                first_index_ + i, " holds '", layer_of(parameter) == i ? parameter : tied_to,
                "', tied to '", layer_of(parameter) == i ? tied_to : parameter,
                "'; a tied layer cannot be replaced");
  }
  replace_child(std::to_string(first_index_ + i), layer);
  layers_[i] = std::move(layer);
}

std::shared_ptr<Sequential> Sequential::slice(size_t begin, size_t end) const {
  PIPIT_CHECK(begin <= end && end <= layers_.size(), "Sequential::slice: [", begin, ", ", end,
              ") is not a range of ", layers_.size(), " layers");
  std::vector<std::shared_ptr<Module>> part(layers_.begin() + static_cast<ptrdiff_t>(begin),
                                            layers_.begin() + static_cast<ptrdiff_t>(end));
  auto out = std::make_shared<Sequential>(std::move(part), first_index_ + begin);
  for (const auto& tie : ties_) {
    const bool first_in = layer_of(tie.first) >= begin && layer_of(tie.first) < end;
    const bool second_in = layer_of(tie.second) >= begin && layer_of(tie.second) < end;
    PIPIT_CHECK(first_in == second_in, "Sequential::slice: layers [", first_index_ + begin, ", ",
                first_index_ + end, ") separate '", tie.first, "' from '", tie.second,
                "', tied to it; pipeline stages cannot share tied parameters yet");
    // The modules are shared, so their parameters are tied already: only the record is copied.
    if (first_in) out->ties_.push_back(tie);
  }
  out->train(is_training());
  return out;
}

std::shared_ptr<Sequential> Sequential::untied_slice(size_t begin, size_t end) const {
  PIPIT_CHECK(begin <= end && end <= layers_.size(), "Sequential::untied_slice: [", begin, ", ",
              end, ") is not a range of ", layers_.size(), " layers");
  std::vector<std::shared_ptr<Module>> part(layers_.begin() + static_cast<ptrdiff_t>(begin),
                                            layers_.begin() + static_cast<ptrdiff_t>(end));
  for (const auto& tie : ties_) {
    const size_t i = layer_of(tie.first);
    if (i < begin || i >= end || part[i - begin] != layers_[i]) continue;
    auto copy = build_module(layers_[i]->config());
    const std::vector<Tensor> originals = layers_[i]->parameters();
    if (!originals.empty()) copy->to(originals.front().device());
    StateDict values;
    for (const auto& [name, value] : layers_[i]->state_dict())
      values[name] = value.detach().clone();
    copy->load_state_dict(values);
    copy->train(is_training());
    part[i - begin] = copy;
  }
  auto out = std::make_shared<Sequential>(std::move(part), first_index_ + begin);
  out->train(is_training());
  return out;
}

}  // namespace pipit
