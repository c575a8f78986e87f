// A saved model directory is replaced as a unit: config.json and model.safetensors always
// belong to the same model, a save that fails at any step leaves the previous model loadable
// and no staging directory behind, and a reader never pairs one model's config with another's
// weights. Failures are injected through set_file_fault_hook.
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "codec/atomic_file.h"
#include "codec/durable_fs.h"
#include "file_faults.h"
#include "nn/builders.h"
#include "nn/registry.h"
#include "pipit.h"
#include "serialize/model_io.h"

using namespace pipit;
using namespace pipit::testing;
namespace fs = std::filesystem;

namespace {

const std::set<std::string> kModelFiles = {"config.json", "model.safetensors"};

// Two models that cannot load each other's weights, so a mixed pair cannot pass as either.
std::shared_ptr<Module> model_a() {
  Generator generator(1);
  return mlp({3, 4}, "relu", &generator);
}
std::shared_ptr<Module> model_b() {
  Generator generator(2);
  return mlp({3, 5, 2}, "tanh", &generator);
}

bool same_model(const Module& a, const Module& b) {
  if (a.config() != b.config()) return false;
  const StateDict sa = a.state_dict(), sb = b.state_dict();
  if (sa.size() != sb.size()) return false;
  for (const auto& [name, t] : sa) {
    if (!sb.count(name) || sb.at(name).shape() != t.shape() ||
        sb.at(name).to_vector<float>() != t.to_vector<float>()) {
      return false;
    }
  }
  return true;
}

// A module whose state cannot be encoded: "__metadata__" is no safetensors tensor name.
class Unwritable : public Module {
 public:
  Unwritable() { register_parameter("__metadata__", zeros({2})); }
  Tensor forward(const Tensor& x) override { return x; }
  json config() const override { return {{"type", "Unwritable"}}; }
};

}  // namespace

TEST_CASE("saving over a model directory replaces both files", "[serialize][model_dir]") {
  const TempDir root("model_dir_replace");
  const std::string dir = (root / "model").string();
  const auto a = model_a(), b = model_b();
  save_model(*a, dir);
  CHECK(same_model(*load_model(dir), *a));
  save_model(*b, dir);
  CHECK(same_model(*load_model(dir), *b));
  CHECK(entries(dir) == kModelFiles);
  CHECK(entries(root.path) == std::set<std::string>{"model"});
  // The directory's mode survives the replacement.
  fs::permissions(dir, fs::perms::owner_all);
  save_model(*a, dir);
  CHECK(fs::status(dir).permissions() == fs::perms::owner_all);
  CHECK(same_model(*load_model(dir), *a));
  // Into an existing empty directory, through a trailing separator, and where parents are
  // missing.
  fs::create_directories(root / "empty");
  save_model(*a, (root / "empty").string() + "/");
  CHECK(same_model(*load_model((root / "empty").string()), *a));
  save_model(*a, (root / "new" / "deeper").string());
  CHECK(same_model(*load_model((root / "new" / "deeper").string()), *a));
  CHECK(entries(root.path) == std::set<std::string>{"empty", "model", "new"});
}

TEST_CASE("a model save that fails at any step keeps the previous model whole",
          "[serialize][model_dir]") {
  const TempDir root("model_dir_faults");
  const std::string dir = (root / "m").string();
  const auto a = model_a(), b = model_b();
  save_model(*a, dir);
  struct Case {
    FileStep step;
    const char* path_fragment;
  };
  for (const Case& c :
       {Case{FileStep::MakeDir, ".m.tmp."}, Case{FileStep::Create, "config.json"},
        Case{FileStep::Write, "model.safetensors"}, Case{FileStep::Sync, "config.json"},
        Case{FileStep::Close, "model.safetensors"}, Case{FileStep::SyncDir, ".m.tmp."},
        Case{FileStep::Exchange, dir.c_str()}}) {
    INFO("failing step " << static_cast<int>(c.step) << " on " << c.path_fragment);
    const InjectFault fault(c.step, c.path_fragment);
    CHECK_THROWS_WITH(save_model(*b, dir),
                      Catch::StartsWith("save_model '" + dir + "'") && Catch::Contains(kEio));
    CHECK(same_model(*load_model(dir), *a));
    CHECK(entries(dir) == kModelFiles);
    CHECK(entries(root.path) == std::set<std::string>{"m"});
  }
  // A state that cannot be encoded fails before anything touches the disk.
  CHECK_THROWS_WITH(save_model(Unwritable(), dir), Catch::Contains("__metadata__"));
  CHECK(same_model(*load_model(dir), *a));
  CHECK(entries(root.path) == std::set<std::string>{"m"});
}

TEST_CASE("without RENAME_EXCHANGE a save falls back to two renames and undoes the first",
          "[serialize][model_dir]") {
  const TempDir root("model_dir_fallback");
  const std::string dir = (root / "m").string();
  const std::string target = fs::canonical(root.path).string() + "/m";
  const auto a = model_a(), b = model_b();
  save_model(*a, dir);
  int renames = 0;
  auto no_exchange = [&](int fail_rename) {
    renames = 0;
    set_file_fault_hook([&, fail_rename](FileStep step, const std::string&) {
      if (step == FileStep::Exchange) return EINVAL;
      if (step == FileStep::Rename) return ++renames == fail_rename ? EIO : 0;
      return 0;
    });
  };
  for (const int fail_rename : {1, 2}) {  // the previous model moving aside, the new one in
    INFO("failing rename " << fail_rename);
    no_exchange(fail_rename);
    CHECK_THROWS_WITH(save_model(*b, dir), Catch::Contains(kEio));
    set_file_fault_hook(nullptr);
    CHECK(same_model(*load_model(dir), *a));
    CHECK(entries(root.path) == std::set<std::string>{"m"});
  }
  no_exchange(0);
  save_model(*b, dir);
  set_file_fault_hook(nullptr);
  CHECK(renames == 2);
  CHECK(same_model(*load_model(dir), *b));
  CHECK(entries(dir) == kModelFiles);
  CHECK(entries(root.path) == std::set<std::string>{"m"});
  CHECK(fs::is_directory(target));
}

TEST_CASE("a failed fsync of the parent after the swap is reported, the new model kept",
          "[serialize][model_dir]") {
  const TempDir root("model_dir_parent_sync");
  const std::string dir = (root / "m").string();
  const auto a = model_a(), b = model_b();
  save_model(*a, dir);
  const std::string parent = fs::canonical(root.path).string();
  set_file_fault_hook([&](FileStep step, const std::string& path) {
    return step == FileStep::SyncDir && path == parent ? EIO : 0;
  });
  CHECK_THROWS_WITH(save_model(*b, dir),
                    Catch::Contains("may not survive a crash") && Catch::Contains(kEio));
  set_file_fault_hook(nullptr);
  CHECK(same_model(*load_model(dir), *b));
  CHECK(entries(dir) == kModelFiles);
  CHECK(entries(root.path) == std::set<std::string>{"m"});
}

TEST_CASE("a directory holding more than a model is not replaced", "[serialize][model_dir]") {
  const TempDir root("model_dir_foreign");
  const fs::path dir = root / "m";
  const auto a = model_a(), b = model_b();
  save_model(*a, dir.string());
  std::ofstream(dir / "notes.txt") << "mine";
  CHECK_THROWS_WITH(save_model(*b, dir.string()),
                    Catch::Contains("notes.txt") && Catch::Contains("not part of a saved model"));
  CHECK(same_model(*load_model(dir.string()), *a));
  CHECK(read_file((dir / "notes.txt").string()) == "mine");
  CHECK(entries(root.path) == std::set<std::string>{"m"});
  // A file where the directory should be is refused too.
  std::ofstream(root / "file") << "x";
  CHECK_THROWS_WITH(save_model(*a, (root / "file").string()),
                    Catch::Contains("is not a directory"));
  CHECK(read_file((root / "file").string()) == "x");
  // Temporaries that a killed writer of an earlier layout left are a model's own.
  fs::remove(dir / "notes.txt");
  std::ofstream(dir / ".model.safetensors.tmp.1") << "half";
  save_model(*b, dir.string());
  CHECK(same_model(*load_model(dir.string()), *b));
  CHECK(entries(dir) == kModelFiles);
}

TEST_CASE("a model directory reached through a symlink is replaced behind the link",
          "[serialize][model_dir]") {
  const TempDir root("model_dir_symlink");
  const auto a = model_a(), b = model_b();
  save_model(*a, (root / "v1").string());
  fs::create_directory_symlink("v1", root / "latest");
  save_model(*b, (root / "latest").string());
  CHECK(fs::is_symlink(root / "latest"));
  CHECK(same_model(*load_model((root / "v1").string()), *b));
  CHECK(entries(root.path) == std::set<std::string>{"latest", "v1"});
}

TEST_CASE("loads racing saves always get one whole model", "[serialize][model_dir]") {
  const TempDir root("model_dir_race");
  const std::string dir = (root / "m").string();
  const auto a = model_a(), b = model_b();
  save_model(*a, dir);
  std::atomic<bool> saving{true};
  std::string save_error;
  std::thread saver([&] {
    try {
      for (int i = 0; i < 40; ++i) save_model(i % 2 ? *a : *b, dir);
    } catch (const Error& e) {
      save_error = e.what();
    }
    saving = false;
  });
  int loads = 0, mixed = 0;
  std::string load_error;
  while (saving) {
    try {
      const auto loaded = load_model(dir);
      mixed += !same_model(*loaded, *a) && !same_model(*loaded, *b);
    } catch (const Error& e) {
      load_error = e.what();
      ++mixed;
    }
    ++loads;
  }
  saver.join();
  CHECK(save_error.empty());
  CHECK(load_error.empty());
  CHECK(mixed == 0);
  CHECK(loads > 0);
  CHECK(entries(root.path) == std::set<std::string>{"m"});
}
