// Encode speed of pipit's byte-level BPE (text/) against Hugging Face tokenizers and tiktoken
// (bench/tokenizer.py) on the same text and files, one thread each; checks that all give the
// same ids, prints a table and appends it to bench/RESULTS.md.
//   tokenizer [--text FILE] [--reps N] [--python PYTHON]
// The models: tests/data/tokenizer (3000 tokens, HF's trainer) and one of 16384 tokens
// trained here by pipit's trainer on the text, written where the peers can read it.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/results.h"
#include "support/flags.h"
#include "text/bpe_trainer.h"
#include "text/tokenizer.h"

using namespace pipit::text;
using nlohmann::json;

namespace {

uint64_t fnv(const std::vector<uint32_t>& ids) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const uint32_t id : ids) h = (h ^ id) * 0x100000001B3ull;
  return h;
}

struct Speed {
  double cold_mbs = 0, warm_mbs = 0;
  size_t tokens = 0;
  uint64_t hash = 0;
};

// Best of `reps`: a fresh tokenizer (empty cache) encodes the text, then encodes it again.
Speed time_pipit(const std::string& dir, const std::string& text, int reps) {
  Speed speed;
  const auto mbs = [&](auto start) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return double(text.size()) / 1e6 / s;
  };
  for (int rep = 0; rep < reps; ++rep) {
    const Tokenizer tokenizer = Tokenizer::from_directory(dir);
    auto start = std::chrono::steady_clock::now();
    const std::vector<uint32_t> ids = tokenizer.encode(text);
    speed.cold_mbs = std::max(speed.cold_mbs, mbs(start));
    start = std::chrono::steady_clock::now();
    tokenizer.encode(text);
    speed.warm_mbs = std::max(speed.warm_mbs, mbs(start));
    speed.tokens = ids.size();
    speed.hash = fnv(ids);
  }
  return speed;
}

std::vector<json> run_peers(const std::string& python, const std::string& dir,
                            const std::string& text_path, int reps) {
  const std::string command = python + " " + PIPIT_SOURCE_DIR + "/bench/tokenizer.py --text " +
                              text_path + " --tokenizer " + dir + " --reps " + std::to_string(reps);
  return pipit::bench::peer_json_lines(command, "tokenizer");
}

}  // namespace

int main(int argc, char** argv) {
  pipit::support::Flags flags("tokenizer",
                              "pipit's BPE encode speed vs HF tokenizers and tiktoken");
  flags.add("text", std::string(PIPIT_SOURCE_DIR) + "/../shared/data/tinyshakespeare.txt",
            "the text to encode");
  flags.add("reps", "5", "runs per measurement; the best is reported");
  flags.add("python", "python3", "the Python with tokenizers (and tiktoken) installed");
  flags.parse(argc, argv);
  const std::string text_path = flags.str("text");
  const std::string text = read_text_file(text_path);
  const int reps = static_cast<int>(flags.integer("reps"));

  const std::string trained = (std::filesystem::temp_directory_path() / "pipit_bench_bpe").string();
  BpeTrainer trainer({.vocab_size = 16384});
  trainer.add_text(text);
  save_vocab_merges(trainer.train(), trained);

  std::ostringstream table;
  table << "Encode speed, one thread, " << text.size() << " bytes of "
        << std::filesystem::path(text_path).filename().string() << ", best of " << reps
        << "; cold: a fresh tokenizer (empty cache), warm: the same text again.\n\n"
        << "| vocab | tool | cold MB/s | warm MB/s | tokens | ids equal pipit's | pipit cold "
           "speed-up |\n"
        << "| --- | --- | --- | --- | --- | --- | --- |\n";
  char row[256];
  for (const auto& [dir, label] : std::vector<std::pair<std::string, std::string>>{
           {std::string(PIPIT_SOURCE_DIR) + "/tests/data/tokenizer", "3000 (HF-trained)"},
           {trained, "16384 (pipit-trained)"}}) {
    const Speed pipit = time_pipit(dir, text, reps);
    std::snprintf(row, sizeof row, "| %s | pipit | %.2f | %.2f | %zu | - | - |\n", label.c_str(),
                  pipit.cold_mbs, pipit.warm_mbs, pipit.tokens);
    table << row;
    for (const json& peer : run_peers(flags.str("python"), dir, text_path, reps)) {
      const double cold = peer.at("cold_mbs");
      std::snprintf(row, sizeof row, "| %s | %s | %.2f | %.2f | %zu | %s | %.2fx |\n",
                    label.c_str(), peer.at("tool").get<std::string>().c_str(), cold,
                    peer.at("warm_mbs").get<double>(), peer.at("tokens").get<size_t>(),
                    peer.at("fnv").get<uint64_t>() == pipit.hash ? "yes" : "NO",
                    pipit.cold_mbs / cold);
      table << row;
    }
  }
  std::fputs(table.str().c_str(), stdout);
  pipit::bench::append_results("tokenizer (bench/tokenizer.cpp)", table.str());
  return 0;
}
