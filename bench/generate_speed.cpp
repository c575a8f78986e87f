// Generation speed with a KV cache: pipit's generate() against Hugging Face transformers'
// generate (bench/generate_speed.py) on the same GPT-2 checkpoint, prompts and greedy decoding,
// in f32 and in bf16, on the CPU with all cores or on a GPU (--device cuda, both sides). Prints new
// tokens per second for each batch size, and whether both produced the same ids; appends the
// table to bench/RESULTS.md.
//   generate_speed [--model DIR] [--device cpu|cuda] [--new 256] [--reps 2] [--python PYTHON]
//                  [--peer-bf16-batch8]
// Without --model, bench/generate_speed.py makes a random GPT-2 small (124M) in a temporary folder.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "bench/results.h"
#include "nn/generate.h"
#include "pipit.h"
#include "serialize/hf_gpt2.h"
#include "support/flags.h"

using namespace pipit;
using nlohmann::json;

namespace {

std::vector<std::vector<int64_t>> prompts(int64_t batch, int64_t length, int64_t vocab) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < length; ++t)
      out[size_t(b)].push_back((b * 7919 + t * 104729 + 13) % vocab);
  }
  return out;
}

std::string fixed(const char* format, double value) {
  char text[32];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

uint64_t fnv(const std::vector<std::vector<int64_t>>& rows) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const auto& row : rows) {
    for (const int64_t id : row) h = (h ^ static_cast<uint64_t>(id)) * 0x100000001B3ull;
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("generate_speed", "pipit's KV-cache generation vs transformers' generate");
  flags.add("model", "", "a Hugging Face GPT-2 directory (default: a random GPT-2 small)");
  flags.add("new", "256", "new tokens per prompt");
  flags.add("prompt", "16", "tokens per prompt");
  flags.add("reps", "2", "runs per measurement; the best is reported");
  flags.add("device", "cpu", "cpu, or cuda: the model and transformers' on GPU 0");
  flags.add("python", "python3", "the Python with torch and transformers installed");
  flags.add_switch("peer-bf16-batch8", "also time transformers in bf16 at batch 8 (slow)");
  flags.parse(argc, argv);
  const std::string device_name = flags.choice("device", {"cpu", "cuda"});
  try {
    const std::string script = std::string(PIPIT_SOURCE_DIR) + "/bench/generate_speed.py";
    std::string dir = flags.str("model");
    if (dir.empty()) {
      dir = (std::filesystem::temp_directory_path() / "pipit_bench_gpt2_small").string();
      if (!std::filesystem::exists(dir + "/model.safetensors")) {
        bench::peer_json_lines(flags.str("python") + " " + script + " --make " + dir,
                               "generate_speed");
      }
    }
    const bool on_gpu = device_name == "cuda";
    auto model = load_hf_gpt2(dir);
    if (on_gpu) model->to(Device::cuda(0));
    const int64_t vocab = read_hf_gpt2_config(dir).gpt.vocab_size;
    GenerationOptions options;
    options.max_new_tokens = flags.integer("new");
    const int64_t prompt_length = flags.integer("prompt");
    const int reps = static_cast<int>(flags.integer("reps"));
    // transformers in bf16 on a CPU without AVX-512 BF16 runs far slower than in f32 (one
    // batch-8 run took over 14 minutes here): there its bf16 row is batch 1, one run, unless
    // --peer-bf16-batch8. A GPU runs both.
    auto peer_rows = [&](const std::string& dtype, const std::string& batches, int runs) {
      return bench::peer_json_lines(
          flags.str("python") + " " + script + " --model " + dir + " --batch " + batches +
              " --new " + std::to_string(options.max_new_tokens) + " --prompt " +
              std::to_string(prompt_length) + " --reps " + std::to_string(runs) + " --dtype " +
              dtype + " --device " + device_name,
          "generate_speed");
    };
    const std::vector<json> peers_f32 = peer_rows("f32", "1 8", reps);
    const std::vector<json> peers_bf16 = flags.on("peer-bf16-batch8") || on_gpu
                                             ? peer_rows("bf16", "1 8", reps)
                                             : peer_rows("bf16", "1", 1);
    auto peer_of = [](const std::vector<json>& rows, int64_t batch) {
      for (const json& row : rows) {
        if (row.value("batch", 0) == batch) return row;
      }
      return json();
    };
    std::ostringstream table;
    table << "GPT-2 shape of " << dir << " (" << model->parameter_count()
          << " parameters), greedy, " << prompt_length << "-token prompts, "
          << options.max_new_tokens << " new tokens, KV cache on both sides, "
          << (on_gpu ? "on GPU 0"
                     : "on the CPU: pipit " + std::to_string(get_num_threads()) + " threads")
          << ". bf16: pipit runs under autocast (GenerationOptions::dtype): weights and "
             "each product's operands rounded to bf16, f32 sums, bf16 activations; transformers "
             "loads the model in bf16 "
             "(`dtype=torch.bfloat16`). Fastest: the better of transformers' two dtypes at that "
             "batch.\n\n"
          << "| batch | dtype | pipit tokens/s | transformers tokens/s | pipit / transformers | "
             "pipit / transformers' fastest | same ids |\n"
          << "|---|---|---|---|---|---|---|\n";
    std::string peer_tool;
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const std::string name = dtype == DType::f32 ? "f32" : "bf16";
      options.dtype = dtype;
      for (const int64_t batch : {1, 8}) {
        const auto input = prompts(batch, prompt_length, vocab);
        double best = 1e300;
        std::vector<std::vector<int64_t>> out;
        for (int rep = 0; rep < reps; ++rep) {
          const auto start = std::chrono::steady_clock::now();
          out = generate(*model, input, options);
          const auto stop = std::chrono::steady_clock::now();
          best = std::min(best, std::chrono::duration<double>(stop - start).count());
        }
        const double ours = double(batch * options.max_new_tokens) / best;
        const json peer = peer_of(dtype == DType::f32 ? peers_f32 : peers_bf16, batch);
        if (!peer.is_null())
          peer_tool = peer.value("tool", "?") + ", " +
                      (on_gpu ? peer.value("device", "?")
                              : std::to_string(peer.value("threads", 0)) + " threads");
        const double theirs = peer.is_null() ? 0.0 : peer.value("tokens_per_s", 0.0);
        double fastest = 0.0;
        for (const auto* rows : {&peers_f32, &peers_bf16}) {
          const json row = peer_of(*rows, batch);
          if (!row.is_null()) fastest = std::max(fastest, row.value("tokens_per_s", 0.0));
        }
        char line[256];
        std::snprintf(line, sizeof line, "| %lld | %s | %.1f | %s | %s | %s | %s |\n",
                      static_cast<long long>(batch), name.c_str(), ours,
                      theirs > 0 ? fixed("%.1f", theirs).c_str() : "-",
                      theirs > 0 ? fixed("%.2fx", ours / theirs).c_str() : "-",
                      fastest > 0 ? fixed("%.2fx", ours / fastest).c_str() : "-",
                      peer.is_null()                               ? "-"
                      : peer.value("fnv", uint64_t{0}) == fnv(out) ? "yes"
                                                                   : "no");
        table << line;
        std::printf("%s", line);
        std::fflush(stdout);
      }
    }
    if (!peer_tool.empty()) table << "\nPeer: " << peer_tool << ".\n";
    std::printf("%s", table.str().c_str());
    bench::append_results(on_gpu ? "generate (KV cache) vs transformers on a GPU"
                                 : "generate (KV cache) vs transformers",
                          table.str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate_speed: %s\n", e.what());
    return 1;
  }
}
