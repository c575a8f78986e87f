// The fuzz harnesses (tests/fuzz/harness) in the normal suite: each replays its seed corpus
// (tests/fuzz/corpus/<harness>) and the inputs of its past findings
// (tests/fuzz/regressions/<harness>) without a finding, and accepts every seed today's
// encoders make, so that the committed corpus keeps reaching past the decoders' first checks
// as formats change. tests/fuzz/run.sh runs the same harnesses under libFuzzer.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/fuzz/harness/harness.h"

namespace fs = std::filesystem;
using pipit::fuzz::Target;

namespace {

const fs::path kFuzzDir = fs::path(PIPIT_SOURCE_DIR) / "tests" / "fuzz";

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

std::vector<fs::path> inputs_in(const fs::path& dir) {
  std::vector<fs::path> files;
  if (fs::is_directory(dir)) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// As libFuzzer would run it: at most max_len bytes.
bool run(const Target& target, const std::string& input) {
  return target.run(reinterpret_cast<const uint8_t*>(input.data()),
                    std::min(input.size(), target.max_len));
}

}  // namespace

TEST_CASE("fuzz harnesses replay their corpus and regressions without findings", "[fuzz_replay]") {
  for (const Target& target : pipit::fuzz::targets()) {
    DYNAMIC_SECTION(target.name) {
      const std::vector<fs::path> corpus = inputs_in(kFuzzDir / "corpus" / target.name);
      CHECK_FALSE(corpus.empty());
      std::vector<fs::path> files = corpus;
      for (const fs::path& path : inputs_in(kFuzzDir / "regressions" / target.name)) {
        files.push_back(path);
      }
      for (const fs::path& path : files) {
        INFO(path.string());
        CHECK_NOTHROW(run(target, read_bytes(path)));
      }
    }
  }
}

TEST_CASE("fuzz harnesses accept the seeds pipit's encoders make", "[fuzz_replay]") {
  for (const Target& target : pipit::fuzz::targets()) {
    DYNAMIC_SECTION(target.name) {
      const std::vector<std::string> seeds = target.seeds();
      CHECK_FALSE(seeds.empty());
      for (size_t i = 0; i < seeds.size(); ++i) {
        INFO("seed " << i << " of " << seeds.size());
        CHECK(seeds[i].size() <= target.max_len);
        bool accepted = false;
        CHECK_NOTHROW(accepted = run(target, seeds[i]));
        CHECK(accepted);
      }
    }
  }
}
