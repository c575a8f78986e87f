#pragma once
// The dense peak FLOP/s of GPUs pipit knows by name, for MFU: what the datasheets give for
// tensor-core math without sparsity (the peak issue 50's and llm.c's MFU count against).
#include <optional>
#include <string>

namespace pipit {

// The peak for `dtype` ("bf16", "f16", or "f32", whose GEMMs run as TF32) of a GPU named
// `name` as CUDA names it ("NVIDIA H100 80GB HBM3"); nullopt for a GPU not in the table.
std::optional<double> dense_peak_flops(const std::string& name, const std::string& dtype);
// The same for CUDA device `index`, by its name; nullopt without CUDA or for an unknown GPU.
std::optional<double> cuda_dense_peak_flops(int index, const std::string& dtype);

}  // namespace pipit
