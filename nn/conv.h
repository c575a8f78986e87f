#pragma once
// Convolution, pooling and flattening layers for image models: [N, C, H, W] in.
#include "autograd/conv.h"
#include "nn/module.h"
#include "tensor/generator.h"

namespace pipit {

// weight [out, in, kh, kw], bias [out]. Default init: uniform(+-1/sqrt(in * kh * kw)) for
// both, which is what PyTorch's kaiming_uniform_(a = sqrt(5)) default works out to.
class Conv2d final : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel, Size2 stride = 1,
         Size2 padding = 0, bool bias = true, Generator* generator = nullptr);
  Tensor forward(const Tensor& x) override;
  json config() const override;
  Tensor weight, bias;  // bias undefined when disabled

 private:
  int64_t in_, out_;
  Size2 kernel_, stride_, padding_;
};

class MaxPool2d final : public Module {
 public:
  MaxPool2d(Size2 kernel, Size2 stride, Size2 padding = 0);
  Tensor forward(const Tensor& x) override;
  json config() const override;

 private:
  Size2 kernel_, stride_, padding_;
};

class AvgPool2d final : public Module {
 public:
  AvgPool2d(Size2 kernel, Size2 stride, Size2 padding = 0);
  Tensor forward(const Tensor& x) override;
  json config() const override;

 private:
  Size2 kernel_, stride_, padding_;
};

// Merges dims [start_dim, end_dim] into one; the default keeps the batch dim, as PyTorch.
class Flatten final : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& x) override;
  json config() const override;

 private:
  int64_t start_, end_;
};

}  // namespace pipit
