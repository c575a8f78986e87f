#pragma once
// Which parameters weight decay spares. GPT-2 trainers decay the weights of matrix products
// alone and leave biases, normalisation weights and embedding tables as they are: decaying a
// LayerNorm's gain or a bias pulls it toward zero, with no regularising effect to show for it.
#include <string>
#include <vector>

#include "nn/sequential.h"

namespace pipit {

// The full-model names of `model`'s parameters that are not a Linear's or a Conv2d's weight:
// biases, LayerNorm weights, embedding tables, and every parameter of other modules. A
// parameter tied to another (Sequential::tie, a GPT-2 head tied to its token table) follows
// the one it is tied to, under both names, so a pipeline's stages agree on its untied copies.
// What AdamWOptions::no_decay (the optimizer config's "no_decay") takes.
std::vector<std::string> no_weight_decay(const Sequential& model);

}  // namespace pipit
