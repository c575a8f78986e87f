// libFuzzer's entry points for the one harness this executable is built for
// (PIPIT_FUZZ_TARGET, set per executable by CMakeLists.txt).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "tests/fuzz/harness/harness.h"

namespace {

const pipit::fuzz::Target* target = nullptr;

}  // namespace

// Sanitizer defaults, compiled in so that a finding reproduces with the bare executable.
// Allocations over 256 MiB fail as they would in a process with bounded memory: pipit's
// tensor allocator turns that into a pipit::Error, while operator new (a std::vector or
// std::string sized from a declared length) still reports it as a finding. No decoder needs
// that much for a fuzz input; module configs declare weights that build_module allocates and
// initialises, and without this bound one input could take a GiB and tens of seconds.
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1:max_allocation_size_mb=256:detect_leaks=1";
}
extern "C" const char* __ubsan_default_options() {
  return "print_stacktrace=1:halt_on_error=1";
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // One OpenMP thread: the fuzzer runs one input at a time, and the machine is shared.
  setenv("OMP_NUM_THREADS", "1", 0);
  target = pipit::fuzz::find_target(PIPIT_FUZZ_TARGET);
  if (!target) {
    std::fprintf(stderr, "fuzz: no harness named %s\n", PIPIT_FUZZ_TARGET);
    std::abort();
  }
  // The harness's -max_len goes before the command line's flags, so that one given there wins
  // (libFuzzer parses the arguments after this returns).
  static std::string max_len = "-max_len=" + std::to_string(target->max_len);
  static std::vector<char*> args;
  args.assign(*argv, *argv + *argc);
  args.insert(args.begin() + 1, max_len.data());
  args.push_back(nullptr);
  *argc += 1;
  *argv = args.data();
  std::fprintf(stderr, "fuzz: harness %s, default %s\n", target->name, max_len.c_str());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    target->run(data, size);
  } catch (const pipit::fuzz::Finding& finding) {
    std::fprintf(stderr, "==pipit-fuzz== FINDING (%s): %s\n", target->name, finding.what());
    std::abort();
  } catch (const std::exception& e) {
    // Harnesses turn every unexpected exception into a Finding; this is one they missed.
    std::fprintf(stderr, "==pipit-fuzz== FINDING (%s): escaped the harness: %s\n", target->name,
                 e.what());
    std::abort();
  }
  return 0;
}
