// Writes every harness's seed inputs, made by pipit's own encoders, as files
// OUT_DIR/<harness>/seed-<n>: how tests/fuzz/corpus is (re)generated.
//   fuzz_write_seeds OUT_DIR [HARNESS...]
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/fuzz/harness/harness.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [HARNESS...]\n", argv[0]);
    return 2;
  }
  const std::filesystem::path out = argv[1];
  for (const pipit::fuzz::Target& target : pipit::fuzz::targets()) {
    bool wanted = argc == 2;
    for (int i = 2; i < argc; ++i) wanted = wanted || target.name == std::string(argv[i]);
    if (!wanted) continue;
    const std::vector<std::string> seeds = target.seeds();
    std::filesystem::create_directories(out / target.name);
    for (size_t i = 0; i < seeds.size(); ++i) {
      const auto path = out / target.name / ("seed-" + std::to_string(i));
      std::ofstream(path, std::ios::binary) << seeds[i];
    }
    std::printf("%s: %zu seeds\n", target.name, seeds.size());
  }
  return 0;
}
