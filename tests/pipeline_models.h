#pragma once
// The small models the pipeline tests train, with a batch of `rows`: an MLP of 9 layers and
// a 2-block GPT, both seeded, so every test builds the same ones.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/builders.h"
#include "pipit.h"

namespace pipit::testing {

struct Model {
  std::shared_ptr<Sequential> net;
  Tensor input, target;
  nlohmann::json loss = {{"type", "CrossEntropyLoss"}};
};

// 9 layers, so p * v = 8 chunks still fit.
inline Model make_mlp(int64_t rows = 8) {
  Generator generator(3);
  Model m{mlp({6, 12, 12, 12, 12, 3}, "tanh", &generator), randn({rows, 6}, &generator), Tensor()};
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < rows; ++i) labels.push_back((i * 5) % 3);
  m.target = from_vector(labels, {rows});
  return m;
}

inline Model make_gpt(int64_t rows = 8) {
  Generator generator(5);
  GptConfig config{11, 6, 6, 2, 16, 0.0};
  std::vector<int64_t> x, y;
  for (int64_t i = 0; i < rows * 6; ++i) {
    x.push_back((i * 7) % 11);
    y.push_back((i * 7 + 3) % 11);
  }
  return {gpt(config, &generator),
          from_vector(x, {rows, 6}),
          from_vector(y, {rows, 6}),
          {{"type", "CrossEntropyLoss"}}};
}

inline Model make_model(const std::string& name, int64_t rows = 8) {
  return name == "mlp" ? make_mlp(rows) : make_gpt(rows);
}

}  // namespace pipit::testing
