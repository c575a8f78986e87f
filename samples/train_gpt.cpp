// Trains a character-level GPT as a pipeline: on --data FILE, or on text it generates itself.
// One clear path: text -> token ids -> random windows -> Pipeline::train_step (microbatches
// flow through the stages, the coordinator computes the loss, every stage steps AdamW).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "comm/crc32c.h"
#include "flags.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "nn/registry.h"
#include "optim/optimizer.h"
#include "pipeline/distributed_pipeline.h"
#include "pipeline/pipeline.h"
#include "pipit.h"
#include "serialize/atomic_file.h"
#include "serialize/checkpoint.h"

using namespace pipit;

namespace {

// A small made-up language with real structure (grammar, agreement, punctuation), so the
// demo needs no files and its loss falls visibly.
std::string generated_text(size_t length, uint64_t seed) {
  const std::vector<std::string> subjects = {"the cat",  "a dog",        "the old man", "my sister",
                                             "the king", "a small bird", "the sailor"};
  const std::vector<std::string> verbs = {"sees",  "likes",     "follows",
                                          "calls", "remembers", "finds"};
  const std::vector<std::string> objects = {"the sea",    "a red apple", "the tall tower",
                                            "her friend", "the moon",    "a quiet song"};
  const std::vector<std::string> endings = {".", "!", " today.", " again.", " at night."};
  Generator generator(seed);
  auto pick = [&](const std::vector<std::string>& words) {
    return words[generator.bits(generator.reserve(1)) % words.size()];
  };
  std::string text;
  while (text.size() < length) {
    text += pick(subjects) + " " + pick(verbs) + " " + pick(objects) + pick(endings) + "\n";
  }
  return text;
}

struct Vocabulary {
  std::vector<char> chars;
  int index_of[256];
  explicit Vocabulary(const std::string& text) {
    bool seen[256] = {};
    for (unsigned char c : text) seen[c] = true;
    for (int c = 0; c < 256; ++c) {
      index_of[c] = -1;
      if (seen[c]) {
        index_of[c] = static_cast<int>(chars.size());
        chars.push_back(static_cast<char>(c));
      }
    }
  }
};

// `batch` random windows of context + 1 tokens: inputs are the first context, targets the
// last context.
std::pair<Tensor, Tensor> sample_batch(const std::vector<int64_t>& tokens, int64_t batch,
                                       int64_t context, Generator& generator) {
  std::vector<int64_t> x(static_cast<size_t>(batch * context)), y(x.size());
  const uint64_t span = tokens.size() - static_cast<uint64_t>(context) - 1;
  for (int64_t b = 0; b < batch; ++b) {
    uint64_t start = generator.bits(generator.reserve(1)) % span;
    for (int64_t t = 0; t < context; ++t) {
      x[static_cast<size_t>(b * context + t)] = tokens[start + static_cast<uint64_t>(t)];
      y[static_cast<size_t>(b * context + t)] = tokens[start + static_cast<uint64_t>(t) + 1];
    }
  }
  return {from_vector(x, {batch, context}), from_vector(y, {batch, context})};
}

std::string sample_text(Module& model, const Vocabulary& vocab, int64_t first_token,
                        int64_t context, int64_t length, Generator& generator) {
  NoGradGuard no_grad;
  model.eval();
  std::vector<int64_t> tokens = {first_token};
  for (int64_t i = 0; i < length; ++i) {
    size_t begin = tokens.size() > static_cast<size_t>(context) ? tokens.size() - context : 0;
    std::vector<int64_t> window(tokens.begin() + static_cast<int64_t>(begin), tokens.end());
    const int64_t T = static_cast<int64_t>(window.size());
    Tensor logits = model(from_vector(window, {1, T}));
    Tensor last = narrow(logits, 1, T - 1, 1);
    std::vector<float> probs = softmax(reshape(last, {-1}), 0).to_vector<float>();
    double u = generator.uniform(generator.reserve(1)), cumulative = 0;
    int64_t next = static_cast<int64_t>(probs.size()) - 1;
    for (size_t c = 0; c < probs.size(); ++c) {
      cumulative += probs[c];
      if (u < cumulative) {
        next = static_cast<int64_t>(c);
        break;
      }
    }
    tokens.push_back(next);
  }
  model.train();
  std::string text;
  for (int64_t t : tokens) text += vocab.chars[static_cast<size_t>(t)];
  return text;
}

// Every weight's name and bytes, in name order: two runs that print the same value trained
// the same weights bit for bit.
uint32_t weights_checksum(const Sequential& model) {
  Crc32c crc;
  for (const auto& [name, value] : model.state_dict()) {
    const Tensor dense = value.detach().to(Device::cpu()).contiguous();
    crc.update(name);
    crc.update(dense.raw_data(), dense.nbytes());
  }
  return crc.value();
}

// --remap STEP:FROM:TO:COUNT.
struct RemapRequest {
  int64_t step = 0;
  int from = 0, to = 0;
  int64_t count = 0;
};

int64_t parse_integer(const samples::Flags& flags, const std::string& flag,
                      const std::string& text) {
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0') {
    flags.fail(flag + " expects integers, got '" + text + "'");
  }
  return value;
}

RemapRequest parse_remap(const samples::Flags& flags, const std::string& text) {
  std::vector<int64_t> parts;
  for (size_t begin = 0; begin <= text.size();) {
    const size_t colon = std::min(text.find(':', begin), text.size());
    parts.push_back(parse_integer(flags, "--remap " + text, text.substr(begin, colon - begin)));
    begin = colon + 1;
  }
  if (parts.size() != 4 || parts[0] < 0 || parts[1] < 0 || parts[2] < 0 || parts[3] < 1) {
    flags.fail("--remap expects STEP:FROM:TO:COUNT (STEP, FROM, TO >= 0, COUNT >= 1), got '" +
               text + "'");
  }
  return {parts[0], static_cast<int>(parts[1]), static_cast<int>(parts[2]), parts[3]};
}

}  // namespace

int main(int argc, char** argv) {
  samples::Flags flags("train_gpt", "Trains a character-level GPT and prints its loss.");
  flags.add("data", "", "text file to train on (default: text generated by the program)");
  flags.add("layers", "4", "transformer blocks");
  flags.add("heads", "4", "attention heads");
  flags.add("width", "128", "embedding width");
  flags.add("context", "64", "tokens per sequence");
  flags.add("batch", "16", "sequences per step");
  flags.add("steps", "200", "optimizer steps");
  flags.add("lr", "0.003", "peak learning rate (warm-up then cosine decay)");
  flags.add("seed", "1", "random seed (weights, batches, sampling)");
  flags.add("threads", "0", "CPU threads per kernel (0: the cores shared out over the stages)");
  flags.add("stages", "2", "pipeline stages");
  flags.add("microbatches", "4", "microbatches per batch (must divide --batch)");
  flags.add("schedule", "1f1b", "pipeline schedule: gpipe, 1f1b or interleaved");
  flags.add("partition", "parameters", "how layers are cut into stages: parameters or uniform");
  flags.add("layer-counts", "",
            "explicit partition: layers per chunk in model order, e.g. 15,9 (the model has "
            "--layers + 3 layers: embedding, blocks, final norm, head)");
  flags.add_repeatable("remap",
                       "STEP:FROM:TO:COUNT: after STEP steps, chunk FROM (a stage when --vpp is "
                       "1) hands COUNT layers to its neighbour TO");
  flags.add_switch("rebalance",
                   "move layers between stages automatically when measured layer times say a "
                   "faster partition pays off (one chunk per stage)");
  flags.add("slowdown", "",
            "per stage in this process, e.g. 1,3: run every layer of stage 1 three times "
            "slower, as a slower machine would (workers: pipit-worker --slowdown)");
  flags.add("vpp", "1", "model chunks per stage (virtual pipeline; > 1 needs interleaved)");
  flags.add("device", "auto",
            "where stages run: auto (cuda when a GPU is present, else cpu), cpu, cuda, "
            "or one device per stage: cuda:0,cuda:1");
  flags.add("dtype", "f32", "f32, or bf16 / f16 mixed precision (f32 master weights)");
  flags.add("trace", "", "write a Chrome trace of the last steps to this file (Perfetto)");
  flags.add("workers", "",
            "host:port,... of pipit-worker processes, one per stage (default: "
            "stages in threads of this process)");
  flags.add("token-file", "", "file holding the token the workers expect");
  flags.add("peer-timeout-ms", "5000", "a worker silent this long is reported lost");
  flags.add("heartbeat-ms", "500", "heartbeat interval on idle connections to the workers");
  flags.add("connect-timeout-ms", "10000", "how long to retry connecting to a busy worker");
  flags.add("step-timeout-ms", "30000", "a step fails when no stage has answered for this long");
  flags.add("checkpoint-dir", "", "directory for checkpoint.safetensors");
  flags.add("checkpoint-every", "0", "steps between checkpoints (0: only at the end)");
  flags.add_switch("resume", "continue from the checkpoint in --checkpoint-dir");
  flags.add("print-every", "10", "steps between progress lines");
  flags.add("sample", "200", "characters to generate after training (0: none)");
  flags.parse(argc, argv);

  try {
    const int64_t layers = flags.integer("layers"), heads = flags.integer("heads");
    const int64_t width = flags.integer("width"), context = flags.integer("context");
    const int64_t batch = flags.integer("batch"), steps = flags.integer("steps");
    const int64_t print_every = flags.integer("print-every");
    const int64_t sample_length = flags.integer("sample", 0);
    const auto seed = static_cast<uint64_t>(flags.integer("seed", 0));
    const double lr = flags.number("lr");
    if (!(lr > 0)) flags.fail("--lr must be positive");
    if (width % heads != 0) flags.fail("--width must be a multiple of --heads");
    const std::vector<std::string> workers = flags.items("workers");
    const int stages = workers.empty() ? static_cast<int>(flags.integer("stages"))
                                       : static_cast<int>(workers.size());
    const std::string checkpoint_dir = flags.str("checkpoint-dir");
    const int64_t checkpoint_every = flags.integer("checkpoint-every", 0);
    const bool resume = flags.on("resume");
    if ((resume || checkpoint_every > 0) && checkpoint_dir.empty()) {
      flags.fail("--resume and --checkpoint-every need --checkpoint-dir");
    }
    const std::string checkpoint_path = checkpoint_dir + "/checkpoint.safetensors";
    if (!checkpoint_dir.empty()) std::filesystem::create_directories(checkpoint_dir);
    const int microbatches = static_cast<int>(flags.integer("microbatches"));
    const int vpp = static_cast<int>(flags.integer("vpp"));
    const std::string schedule_name = flags.str("schedule");
    if (batch % microbatches != 0) flags.fail("--microbatches must divide --batch");
    std::vector<int64_t> layer_counts;
    for (const std::string& item : flags.items("layer-counts")) {
      layer_counts.push_back(parse_integer(flags, "--layer-counts", item));
    }
    std::vector<RemapRequest> remaps;
    for (const std::string& text : flags.all("remap")) remaps.push_back(parse_remap(flags, text));
    if (flags.integer("threads", 0) > 0) {
      set_num_threads(static_cast<int>(flags.integer("threads")));
    } else {
      // Stages compute concurrently; sharing the cores out avoids oversubscribing them.
      const int cores = static_cast<int>(std::thread::hardware_concurrency());
      set_num_threads(std::max(1, cores / stages));
    }

    const std::string text =
        flags.str("data").empty() ? generated_text(200000, seed) : read_file(flags.str("data"));
    if (text.size() < static_cast<size_t>(context) + 2) {
      flags.fail("the training text has " + std::to_string(text.size()) +
                 " characters; it needs more than --context + 1");
    }
    Vocabulary vocab(text);
    std::vector<int64_t> tokens;
    tokens.reserve(text.size());
    for (unsigned char c : text) tokens.push_back(vocab.index_of[c]);

    Generator generator(seed);
    GptConfig config{static_cast<int64_t>(vocab.chars.size()), context, layers, heads, width, 0.0};
    auto model = gpt(config, &generator);
    const std::string vocab_text(vocab.chars.begin(), vocab.chars.end());
    int64_t first_step = 0;
    StateDict optimizer_state;
    if (resume) {
      Checkpoint checkpoint = load_checkpoint(checkpoint_path);
      PIPIT_CHECK(checkpoint.extra.value("vocab", std::string()) == vocab_text, "checkpoint '",
                  checkpoint_path, "' was trained on text with another vocabulary");
      model = std::dynamic_pointer_cast<Sequential>(build_module(checkpoint.model_config));
      PIPIT_CHECK(model != nullptr, "checkpoint '", checkpoint_path, "' holds no Sequential");
      model->load_state_dict(checkpoint.weights);
      optimizer_state = std::move(checkpoint.optimizer_state);
      first_step = checkpoint.step;
      // The partition the run had reached (its remaps included), unless one is given.
      const nlohmann::json saved = checkpoint.extra.value("layer_counts", nlohmann::json());
      if (layer_counts.empty() && saved.is_array() &&
          saved.size() == static_cast<size_t>(stages * vpp)) {
        layer_counts = saved.get<std::vector<int64_t>>();
      }
      generator.set_state(checkpoint.rng_seed, checkpoint.rng_offset);
      std::printf("resumed from %s at step %lld\n", checkpoint_path.c_str(),
                  static_cast<long long>(first_step));
    }
    PipelineConfig pipeline_config;
    pipeline_config.stages = stages;
    pipeline_config.microbatches = microbatches;
    pipeline_config.chunks_per_stage = vpp;
    pipeline_config.schedule = schedule_name;
    pipeline_config.partition = flags.str("partition");
    pipeline_config.optimizer = {
        {"type", "AdamW"}, {"lr", lr}, {"beta1", 0.9}, {"beta2", 0.95}, {"weight_decay", 0.01}};
    pipeline_config.max_grad_norm = 1.0;
    pipeline_config.trace = !flags.str("trace").empty();
    pipeline_config.dtype = flags.str("dtype");
    pipeline_config.timeout = std::chrono::milliseconds(flags.integer("step-timeout-ms"));
    std::string device = flags.str("device");
    if (device == "auto") device = cuda_device_count() > 0 ? "cuda" : "cpu";
    for (size_t begin = 0; begin < device.size();) {
      const size_t comma = std::min(device.find(',', begin), device.size());
      pipeline_config.devices.push_back(device.substr(begin, comma - begin));
      begin = comma + 1;
    }
    pipeline_config.layer_counts = layer_counts;
    pipeline_config.rebalance.enabled = flags.on("rebalance");
    for (const std::string& item : flags.items("slowdown")) {
      char* end = nullptr;
      pipeline_config.slowdown.push_back(std::strtod(item.c_str(), &end));
      if (item.empty() || *end != '\0')
        flags.fail("--slowdown expects numbers, got '" + item + "'");
    }
    TcpOptions tcp;
    if (!flags.str("token-file").empty()) tcp.token = read_token_file(flags.str("token-file"));
    tcp.peer_timeout = std::chrono::milliseconds(flags.integer("peer-timeout-ms"));
    tcp.heartbeat_interval = std::chrono::milliseconds(flags.integer("heartbeat-ms"));
    tcp.connect_timeout = std::chrono::milliseconds(flags.integer("connect-timeout-ms"));
    // Stages in threads of this process, or in worker processes: the same Coordinator.
    std::unique_ptr<Pipeline> local;
    std::unique_ptr<DistributedPipeline> remote;
    if (workers.empty()) {
      local = std::make_unique<Pipeline>(model, pipeline_config, optimizer_state);
    } else {
      remote = std::make_unique<DistributedPipeline>(*model, pipeline_config, workers, tcp,
                                                     optimizer_state);
    }
    Coordinator& coordinator = local ? local->coordinator() : remote->coordinator();
    auto ranges = [&] { return coordinator.chunk_ranges(); };
    auto remap = [&](const RemapRequest& request) {
      const auto before = ranges();
      const auto after = move_layers(before, request.from, request.to, request.count);
      const auto start = std::chrono::steady_clock::now();
      // Pipeline::remap also hands the moved modules to `model`.
      if (local) {
        local->remap(after);
      } else {
        remote->remap(after);
      }
      std::printf(
          "remap after step %lld: %s -> %s (%.1f ms)\n", static_cast<long long>(request.step),
          ranges_str(before).c_str(), ranges_str(after).c_str(),
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    };
    auto save = [&](int64_t steps_done) {
      auto [weights, optimizer] = coordinator.fetch_state();
      save_checkpoint(checkpoint_path,
                      {model->config(),
                       weights,
                       pipeline_config.optimizer,
                       optimizer,
                       steps_done,
                       generator.seed(),
                       generator.offset(),
                       {{"vocab", vocab_text}, {"layer_counts", pipit::layer_counts(ranges())}}});
    };
    CosineSchedule schedule(lr, lr / 10, std::min<int64_t>(20, steps / 10), steps);

    std::printf(
        "train_gpt: %zu characters, vocab %zu, %lld parameters, %d stages x %d chunks, "
        "%d microbatches, %s, %s, %s, %d threads per kernel\n",
        text.size(), vocab.chars.size(), static_cast<long long>(model->parameter_count()), stages,
        vpp, microbatches, schedule_name.c_str(), device.c_str(), pipeline_config.dtype.c_str(),
        get_num_threads());
    std::printf("partition (layers per chunk): %s\n", ranges_str(ranges()).c_str());
    const auto start = std::chrono::steady_clock::now();
    auto last_print = start;
    int64_t tokens_since_print = 0;
    for (int64_t step = first_step; step < steps; ++step) {
      for (const RemapRequest& request : remaps) {
        if (request.step == step) remap(request);
      }
      auto [x, y] = sample_batch(tokens, batch, context, generator);
      coordinator.set_lr(schedule.lr(step));
      if (pipeline_config.trace && step + 3 == steps) coordinator.clear_trace();
      const double loss = coordinator.train_step(x, y);
      if (coordinator.last_step().rebalance_verdict.rfind("rebalancing stopped", 0) == 0) {
        std::printf("after step %lld: %s\n", static_cast<long long>(step + 1),
                    coordinator.last_step().rebalance_verdict.c_str());
      }
      if (const auto& decision = coordinator.last_step().rebalanced) {
        std::printf("rebalanced after step %lld in %.1f ms: %s\n", static_cast<long long>(step + 1),
                    coordinator.last_step().remap_ms, decision->reason().c_str());
      }
      tokens_since_print += batch * context;
      if ((step + 1) % print_every == 0 || step == 0 || step + 1 == steps) {
        auto now = std::chrono::steady_clock::now();
        double since = std::chrono::duration<double>(now - last_print).count();
        double elapsed = std::chrono::duration<double>(now - start).count();
        std::printf("step %5lld  loss %.4f  tokens/s %9.0f  elapsed %.1fs\n",
                    static_cast<long long>(step + 1), loss,
                    static_cast<double>(tokens_since_print) / since, elapsed);
        std::fflush(stdout);
        last_print = now;
        tokens_since_print = 0;
      }
      if (checkpoint_every > 0 && (step + 1) % checkpoint_every == 0) save(step + 1);
    }
    if (!checkpoint_dir.empty()) {
      save(std::max(first_step, steps));
      std::printf("checkpoint written to %s\n", checkpoint_path.c_str());
    }
    // Worker processes trained their own copies of the weights: bring them home to sample.
    if (remote) model->load_state_dict(coordinator.fetch_state().first);
    std::printf("weights CRC-32C: %08x (equal runs, however partitioned, print the same)\n",
                weights_checksum(*model));
    if (pipeline_config.trace) {
      const Trace& trace = coordinator.trace();
      trace.write_chrome_json(flags.str("trace"));
      std::printf("trace of the last steps written to %s\n%s", flags.str("trace").c_str(),
                  trace.timeline().c_str());
    }
    if (sample_length > 0) {
      model->to(Device::cpu());
      std::printf("--- sample ---\n%s\n",
                  sample_text(*model, vocab, tokens[0], context, sample_length, generator).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
