// Trains a character-level GPT as a pipeline: on --data FILE, or on text it generates itself.
// One clear path: text -> token ids -> random windows -> Pipeline::train_step (microbatches
// flow through the stages, the coordinator computes the loss, every stage steps AdamW).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "codec/atomic_file.h"
#include "codec/crc32c.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "nn/generate.h"
#include "nn/layers.h"
#include "nn/registry.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipit.h"
#include "serialize/checkpoint.h"
#include "serialize/hf_gpt2.h"
#include "support/checkpoint_flags.h"
#include "support/flags.h"
#include "support/gpt_flags.h"
#include "support/progress_line.h"
#include "support/run_flags.h"
#include "support/tcp_flags.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "text_data.h"
#include "train/metrics_log.h"
#include "train/weight_decay.h"
#include "train_gpt_data.h"
#include "train_gpt_flags.h"
#include "train_gpt_progress.h"

using namespace pipit;

namespace {

using samples::generated_text;
using samples::read_token_ids;
using samples::sample_batch;
using samples::sample_text;
using samples::Vocabulary;
using namespace samples::train_gpt;

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

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("train_gpt",
                       "Trains a GPT as a pipeline (on characters, GPT-2 tokens or a Hugging Face "
                       "checkpoint) and reports its training and validation loss.");
  add_data_flags(flags);
  add_training_flags(flags);
  support::add_seed_flag(flags, "1", "weights, batches, sampling");
  support::add_threads_flag(flags, "0", "the cores shared out over the stages");
  add_pipeline_flags(flags);
  add_distributed_flags(flags);
  support::add_checkpoint_flags(flags);
  flags.parse(argc, argv);

  try {
    GptConfig shape = support::gpt_config(flags);
    int64_t& context = shape.context;
    const Training training = samples::train_gpt::training(flags);
    const int64_t batch = training.batch, steps = training.steps;
    const int64_t print_every = flags.integer("print-every");
    const int64_t sample_length = flags.integer("sample", 0);
    const uint64_t seed = support::seed_flag(flags);
    const double lr = training.lr;
    const std::vector<std::string> workers = flags.items("workers");
    const std::string launcher = flags.choice("launcher", {"none", "mpi"});
#ifndef PIPIT_WITH_MPI
    if (launcher == "mpi") flags.fail("--launcher mpi: this pipit was built without MPI");
#endif
    if (launcher == "mpi" && !workers.empty()) flags.fail("--launcher mpi runs no --workers");
    const int replicas = static_cast<int>(flags.integer("replicas"));
    if (!workers.empty() && workers.size() % static_cast<size_t>(replicas) != 0) {
      flags.fail("--workers lists " + std::to_string(workers.size()) +
                 " addresses, not a multiple of --replicas " + std::to_string(replicas));
    }
    int stages = workers.empty() ? static_cast<int>(flags.integer("stages"))
                                 : static_cast<int>(workers.size()) / replicas;
    int ranks_on_node = 0;  // MPI: how many ranks share this node's cores
#ifdef PIPIT_WITH_MPI
    if (launcher == "mpi") {
      const MpiJob job = mpi_job();
      if (job.world_size % replicas != 0) {
        flags.fail("--launcher mpi: the job's " + std::to_string(job.world_size) +
                   " ranks are not a multiple of --replicas " + std::to_string(replicas));
      }
      stages = job.world_size / replicas;
      ranks_on_node = job.local_size;
    }
#endif
    const support::CheckpointFlags checkpoints = support::checkpoint_flags(flags);
    const std::string& checkpoint_dir = checkpoints.dir;
    const std::string& checkpoint_path = checkpoints.path;
    const int64_t checkpoint_every = checkpoints.every;
    const int microbatches = static_cast<int>(flags.integer("microbatches"));
    const std::string schedule_name = flags.str("schedule");
    const long long vpp_flag = flags.integer("vpp", 0);
    const int vpp = vpp_flag > 0 ? static_cast<int>(vpp_flag) : schedule_name == "zbv" ? 2 : 1;
    if (batch % (int64_t{microbatches} * replicas) != 0) {
      flags.fail("--batch must split into --replicas x --microbatches equal parts");
    }
    const std::vector<long long> counts = flags.integers("layer-counts");
    std::vector<int64_t> layer_counts(counts.begin(), counts.end());
    std::vector<RemapRequest> remaps;
    for (const std::string& text : flags.all("remap")) remaps.push_back(parse_remap(flags, text));
    if (flags.integer("threads", 0) > 0) {
      set_num_threads(static_cast<int>(flags.integer("threads")));
    } else {
      // Stages compute concurrently; sharing the cores out avoids oversubscribing them (under
      // MPI, among the ranks on this node).
      const int cores = static_cast<int>(std::thread::hardware_concurrency());
      set_num_threads(std::max(1, cores / (ranks_on_node > 0 ? ranks_on_node : stages * replicas)));
    }

    const std::string init = flags.str("init");
    if (!init.empty() && (init.rfind("hf:", 0) != 0 || init.size() == 3)) {
      flags.fail("--init expects hf:DIR, got '" + init + "'");
    }
    const std::string hf_dir = init.empty() ? "" : init.substr(3);
    if (shape.vocab_multiple > 1 && !hf_dir.empty()) {
      flags.fail("--vocab-multiple pads models train_gpt builds; a GPT-2 checkpoint keeps its own");
    }
    std::string tokenizer_dir = flags.str("tokenizer");
    if (tokenizer_dir.empty() && !hf_dir.empty() &&
        (std::filesystem::exists(hf_dir + "/vocab.json") ||
         std::filesystem::exists(hf_dir + "/tokenizer.json"))) {
      tokenizer_dir = hf_dir;
    }
    Generator generator(seed);
    std::shared_ptr<Sequential> model;
    if (!hf_dir.empty()) {
      support::ProgressLine progress("reading " + hf_dir, 0, "MB", 1e6);
      model = load_hf_gpt2(hf_dir, [&](size_t done, size_t total) {
        progress.update(static_cast<double>(done), static_cast<double>(total));
      });
      progress.finish();
      const int64_t positions = read_hf_gpt2_config(hf_dir).gpt.context;
      if (context == 0) context = positions;
      if (context > positions) {
        flags.fail("--context " + std::to_string(context) + " exceeds the checkpoint's " +
                   std::to_string(positions) + " positions");
      }
    }
    if (context == 0) context = 64;
    // Tokens: a token file, a tokenized text, or the text's characters.
    std::optional<Vocabulary> chars;
    std::optional<text::Tokenizer> tokenizer;
    std::vector<int64_t> tokens;
    if (!tokenizer_dir.empty()) tokenizer = text::Tokenizer::from_directory(tokenizer_dir);
    if (!flags.str("tokens").empty()) {
      tokens = read_token_ids(flags.str("tokens"), tokenizer ? tokenizer->vocab_size() : 0);
    } else {
      const std::string text =
          flags.str("data").empty() ? generated_text(200000, seed) : read_file(flags.str("data"));
      if (tokenizer) {
        for (const uint32_t id : tokenizer->encode(text)) tokens.push_back(id);
      } else if (hf_dir.empty()) {
        chars.emplace(text);
        tokens = chars->encode(text);
      } else if (steps > 0) {
        flags.fail("--init " + init + " has no tokenizer: give --tokenizer DIR or --tokens FILE");
      }
    }
    if (steps > 0 && tokens.size() < static_cast<size_t>(context) + 2) {
      flags.fail("the training data has " + std::to_string(tokens.size()) +
                 " tokens; it needs more than --context + 1");
    }
    if (!model) {
      shape.vocab_size = static_cast<int64_t>(chars->chars.size());
      model = gpt(shape, &generator);
    }
    const int64_t vocab_size = dynamic_cast<const TokenPosEmbedding&>(*(*model)[0]).vocab_size();
    for (const int64_t id : tokens) {
      if (id >= vocab_size) {
        flags.fail("token id " + std::to_string(id) + " is outside the model's vocabulary of " +
                   std::to_string(vocab_size));
      }
    }
    // Held-out tokens: a file of their own, or the tail of the training tokens.
    const std::vector<int64_t> val_tokens =
        held_out_tokens(flags, tokens, chars ? &*chars : nullptr, tokenizer ? &*tokenizer : nullptr,
                        steps, context, vocab_size);
    const std::string vocab_text = chars ? std::string(chars->chars.begin(), chars->chars.end())
                                         : "tokenizer:" + tokenizer_dir;
    int64_t first_step = 0;
    StateDict optimizer_state;
    nlohmann::json grad_scaler_state;
    if (checkpoints.resume) {
      support::ProgressLine progress("reading " + checkpoint_path, 0, "MB", 1e6);
      Checkpoint checkpoint = load_checkpoint(checkpoint_path, [&](size_t done, size_t total) {
        progress.update(static_cast<double>(done), static_cast<double>(total));
      });
      progress.finish();
      PIPIT_CHECK(checkpoint.extra.value("vocab", std::string()) == vocab_text, "checkpoint '",
                  checkpoint_path, "' was trained on text with another vocabulary");
      model = std::dynamic_pointer_cast<Sequential>(build_module(checkpoint.model_config));
      PIPIT_CHECK(model != nullptr, "checkpoint '", checkpoint_path, "' holds no Sequential");
      model->load_state_dict(checkpoint.weights);
      optimizer_state = std::move(checkpoint.optimizer_state);
      grad_scaler_state = std::move(checkpoint.grad_scaler);
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
    pipeline_config.replicas = replicas;
    pipeline_config.shard_optimizer = flags.on("shard-optimizer");
    pipeline_config.rank_layout = flags.str("rank-layout");
    pipeline_config.microbatches = microbatches;
    pipeline_config.chunks_per_stage = vpp;
    pipeline_config.schedule = schedule_name;
    // A padded head (--vocab-multiple, or a checkpoint trained with it): the loss reads the
    // vocabulary's logits only.
    const int64_t logits = (*model)[model->size() - 1]->config().value("out", vocab_size);
    if (logits != vocab_size) pipeline_config.loss["classes"] = vocab_size;
    pipeline_config.recompute = flags.str("recompute");
    pipeline_config.max_deferred = static_cast<int>(flags.integer("max-deferred", 0));
    pipeline_config.partition = flags.str("partition");
    pipeline_config.optimizer = {{"type", "AdamW"},
                                 {"lr", lr},
                                 {"beta1", training.beta1},
                                 {"beta2", training.beta2},
                                 {"weight_decay", training.weight_decay},
                                 {"no_decay", no_weight_decay(*model)}};
    pipeline_config.max_grad_norm = training.grad_clip;
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
    pipeline_config.slowdown = flags.numbers("slowdown");
    // Where the stages run is the one choice that differs between transports.
    Launch launch = Launch::threads();
    if (!workers.empty()) {
      launch = Launch::workers(workers, support::tcp_options(flags, support::TcpSide::coordinator));
    } else if (launcher == "mpi") {
      MpiOptions mpi_options;
      mpi_options.pair_replicas = flags.on("mpi-pair-sums");
      launch = Launch::mpi(mpi_options);
    }
    Pipeline pipeline(model, pipeline_config, launch, optimizer_state);
    if (launcher == "mpi") {
      // mpirun names a rank that dies; this line maps it to its stage and node.
      char host[256] = "?";
      gethostname(host, sizeof host - 1);
      const StageSpec& spec = pipeline.local_stages().at(0)->spec();
      std::printf("[mpi] rank %d of %d on %s: stage %d of replica %d, %d threads\n",
                  pipeline.rank(), pipeline.world_size(), host, spec.stage, spec.replica,
                  get_num_threads());
      std::fflush(stdout);
    }
    // Every MPI rank but 0 serves its stage until rank 0 is done; rank 0 goes on as usual.
    if (!pipeline.is_coordinator()) {
      pipeline.serve();
      return 0;
    }
    Coordinator& coordinator = pipeline.coordinator();
    if (!grad_scaler_state.is_null()) coordinator.grad_scaler().load_state_dict(grad_scaler_state);
    auto ranges = [&] { return coordinator.chunk_ranges(); };
    auto remap = [&](const RemapRequest& request) {
      const auto before = ranges();
      const auto after = move_layers(before, request.from, request.to, request.count);
      const auto start = std::chrono::steady_clock::now();
      // On threads the remap also hands the moved modules to `model`.
      pipeline.remap(after);
      std::printf(
          "remap after step %lld: %s -> %s (%.1f ms)\n", static_cast<long long>(request.step),
          ranges_str(before).c_str(), ranges_str(after).c_str(),
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    };
    // The schedule's knobs beside the optimizer's own config, so a checkpoint says how it was
    // trained.
    const nlohmann::json schedule_knobs = {{"lr", lr},
                                           {"min_lr", training.min_lr},
                                           {"warmup_steps", training.warmup_steps},
                                           {"steps", steps},
                                           {"grad_clip", training.grad_clip}};
    auto save = [&](int64_t steps_done, const std::string& path) {
      auto [weights, optimizer] = coordinator.fetch_state();
      const Checkpoint checkpoint{model->config(),
                                  weights,
                                  pipeline_config.optimizer,
                                  optimizer,
                                  steps_done,
                                  generator.seed(),
                                  generator.offset(),
                                  {{"vocab", vocab_text},
                                   {"layer_counts", pipit::layer_counts(ranges())},
                                   {"schedule", schedule_knobs}},
                                  pipeline_config.dtype == "f16"
                                      ? coordinator.grad_scaler().state_dict()
                                      : nlohmann::json()};
      support::ProgressLine progress("writing " + path, 0, "MB", 1e6);
      save_checkpoint(path, checkpoint, [&](size_t done, size_t total) {
        progress.update(static_cast<double>(done), static_cast<double>(total));
      });
    };
    CosineSchedule schedule(lr, training.min_lr, training.warmup_steps,
                            std::max<int64_t>(steps, 1));
    MetricsLog metrics(flags.str("metrics"), flags.str("tensorboard"));
    const bool keep_best = flags.on("keep-best");
    if (keep_best && (checkpoint_dir.empty() || val_tokens.empty())) {
      flags.fail("--keep-best needs --checkpoint-dir and validation data");
    }
    const auto val_batches = validation_batches(val_tokens, training.eval_batches, batch, context);
    auto validation_loss = [&] {
      double sum = 0;
      for (const auto& [x, y] : val_batches) sum += pipeline.evaluate(x, y);
      return sum / static_cast<double>(val_batches.size());
    };
    double best_val_loss = std::numeric_limits<double>::infinity();
    const bool stages_here = workers.empty() && launcher != "mpi";
    const double step_flops =
        flops_per_token(shape, model->parameter_count()) * static_cast<double>(batch * context);
    std::optional<double> peak_tflops;
    if (!flags.str("peak-tflops").empty()) {
      peak_tflops = flags.number("peak-tflops");
      if (!(*peak_tflops > 0)) flags.fail("--peak-tflops must be positive");
    }
    const std::optional<double> peak =
        peak_flops(peak_tflops, pipeline_config.devices, pipeline_config.dtype, stages_here,
                   get_num_threads() * stages * replicas);

    std::printf(
        "train_gpt: %zu tokens, vocab %lld, %lld parameters, %d stages x %d chunks, %d "
        "replicas%s, %d microbatches each, %s, %s, %s, %d threads per kernel\n",
        tokens.size(), static_cast<long long>(vocab_size),
        static_cast<long long>(model->parameter_count()), stages, vpp, replicas,
        pipeline_config.shard_optimizer && replicas > 1 ? " (optimizer sharded)" : "", microbatches,
        schedule_name.c_str(), device.c_str(), pipeline_config.dtype.c_str(), get_num_threads());
    std::printf("partition (layers per chunk): %s\n", ranges_str(ranges()).c_str());
    const auto start = std::chrono::steady_clock::now();
    double train_seconds = 0;  // in train_step since the last progress line
    int64_t tokens_since_print = 0;
    for (int64_t step = first_step; step < steps; ++step) {
      for (const RemapRequest& request : remaps) {
        if (request.step == step) remap(request);
      }
      auto [x, y] = sample_batch(tokens, batch, context, generator);
      coordinator.set_lr(schedule.lr(step));
      if (pipeline_config.trace && step + 3 == steps) coordinator.clear_trace();
      const auto step_start = std::chrono::steady_clock::now();
      const double loss = coordinator.train_step(x, y);
      train_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
      if (coordinator.last_step().rebalance_verdict.rfind("rebalancing stopped", 0) == 0) {
        std::printf("after step %lld: %s\n", static_cast<long long>(step + 1),
                    coordinator.last_step().rebalance_verdict.c_str());
      }
      if (const auto& decision = coordinator.last_step().rebalanced) {
        std::printf("rebalanced after step %lld in %.1f ms: %s\n", static_cast<long long>(step + 1),
                    coordinator.last_step().remap_ms, decision->reason().c_str());
      }
      tokens_since_print += batch * context;
      const bool evaluate = !val_batches.empty() && training.eval_every > 0 &&
                            ((step + 1) % training.eval_every == 0 || step + 1 == steps);
      if ((step + 1) % print_every == 0 || step == 0 || step + 1 == steps || evaluate) {
        Progress progress;
        progress.step = step + 1;
        progress.train_loss = loss;
        progress.lr = schedule.lr(step);
        if (training.grad_clip > 0) progress.grad_norm = coordinator.last_step().grad_norm;
        progress.tokens_per_s = static_cast<double>(tokens_since_print) / train_seconds;
        if (peak)
          progress.mfu = step_flops * static_cast<double>(tokens_since_print) /
                         static_cast<double>(batch * context) / train_seconds / *peak;
        progress.peak_memory_bytes = peak_memory(pipeline_config.devices, stages_here);
        if (evaluate) progress.val_loss = validation_loss();
        progress.elapsed_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("%s\n", metrics.record(progress).c_str());
        std::fflush(stdout);
        train_seconds = 0;
        tokens_since_print = 0;
        if (keep_best && evaluate && *progress.val_loss < best_val_loss) {
          best_val_loss = *progress.val_loss;
          save(step + 1, checkpoint_dir + "/best.safetensors");
        }
      }
      if (checkpoint_every > 0 && (step + 1) % checkpoint_every == 0) {
        save(step + 1, checkpoint_path);
      }
    }
    if (!checkpoint_dir.empty()) {
      save(std::max(first_step, steps), checkpoint_path);
      std::printf("checkpoint written to %s\n", checkpoint_path.c_str());
    }
    // Worker processes or ranks trained their own copies of the weights: bring them home (on
    // threads the model holds them already, and takes the same values).
    model->load_state_dict(coordinator.fetch_state().first);
    std::printf(
        "weights CRC-32C: %08x (runs with the same data and --replicas, however partitioned, print "
        "the same)\n",
        weights_checksum(*model));
    if (pipeline_config.trace) {
      const Trace& trace = coordinator.trace();
      trace.write_chrome_json(flags.str("trace"));
      std::printf("trace of the last steps written to %s\n%s", flags.str("trace").c_str(),
                  trace.timeline().c_str());
    }
    if (!flags.str("save-hf").empty()) {
      // The end-of-text token: the tokenizer's, or the --init checkpoint's, else GPT-2's place
      // for it, the vocabulary's last id.
      std::optional<int64_t> eos;
      if (!hf_dir.empty()) eos = read_hf_gpt2_config(hf_dir).eos_token_id;
      if (tokenizer) {
        if (const auto id = tokenizer->token_id("<|endoftext|>")) eos = *id;
      }
      if (eos && (*eos < 0 || *eos >= vocab_size)) eos.reset();
      support::ProgressLine progress("writing " + flags.str("save-hf"), 0, "MB", 1e6);
      save_hf_gpt2(*model, flags.str("save-hf"), eos, [&](size_t done, size_t total) {
        progress.update(static_cast<double>(done), static_cast<double>(total));
      });
      progress.finish();
      // With its tokenizer beside it, the directory is what from_pretrained and generate read.
      for (const char* file : {"vocab.json", "merges.txt", "tokenizer.json"}) {
        const std::filesystem::path from = std::filesystem::path(tokenizer_dir) / file;
        if (!tokenizer_dir.empty() && std::filesystem::exists(from)) {
          std::filesystem::copy_file(from, std::filesystem::path(flags.str("save-hf")) / file,
                                     std::filesystem::copy_options::overwrite_existing);
        }
      }
      std::printf("Hugging Face checkpoint written to %s\n", flags.str("save-hf").c_str());
    }
    if (sample_length > 0 && chars) {
      model->to(Device::cpu());
      std::printf("--- sample ---\n%s\n",
                  text::valid_utf8(
                      sample_text(*model, *chars, tokens[0], context, sample_length, generator))
                      .c_str());
    } else if (sample_length > 0 && tokenizer && !tokens.empty()) {
      GenerationOptions options;
      options.max_new_tokens = sample_length;
      options.sample = true;
      options.top_k = 40;
      options.seed = seed;
      const std::vector<int64_t> out = generate(*model, {{tokens[0]}}, options).at(0);
      std::vector<uint32_t> ids = {static_cast<uint32_t>(tokens[0])};
      ids.insert(ids.end(), out.begin(), out.end());
      std::printf("--- sample ---\n%s\n", text::valid_utf8(tokenizer->decode(ids)).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
