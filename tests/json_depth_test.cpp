// JSON from files and peers is refused when it nests deeper than kMaxJsonNesting, before it
// is parsed: copying or printing a document 400k levels deep overflowed the stack (found by
// tests/fuzz: a stage package whose chunk_configs text was nested brackets). Shallow JSON and
// brackets inside strings pass.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "codec/json_depth.h"
#include "codec/safetensors.h"
#include "pipeline/remote/stage_package.h"
#include "pipit.h"
#include "serialize/checkpoint.h"

using namespace pipit;
using nlohmann::json;

namespace {

// `depth` nested arrays between `before` and `after`. Built with append: GCC 12 misreports
// operator+ on these strings (-Wrestrict).
std::string nested(size_t depth, const std::string& before = "", const std::string& after = "") {
  std::string text = before;
  text.append(depth, '[');
  text.append(depth, ']');
  text.append(after);
  return text;
}

// A safetensors blob with this raw header text.
std::string blob_with_header(std::string header) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t size = header.size();
  std::memcpy(out.data(), &size, 8);
  out.append(header);
  return out;
}

}  // namespace

TEST_CASE("check_json_nesting counts brackets outside strings", "[serialize]") {
  CHECK_NOTHROW(check_json_nesting(nested(64), "x: "));
  CHECK_THROWS_WITH(check_json_nesting(nested(65), "x: "),
                    Catch::Contains("x: nests deeper than 64 levels"));
  CHECK_NOTHROW(check_json_nesting(R"({"a": "[[[[[[[[[[\"[[[[[["})", "", 2));
  CHECK_THROWS_AS(check_json_nesting(R"({"a": [{"b": [1]}]})", "", 3), Error);
  CHECK_NOTHROW(check_json_nesting("]]]]{}", "", 1));  // not JSON: the parser reports it
}

TEST_CASE("deeply nested JSON in a stage package is an Error, not a stack overflow",
          "[serialize]") {
  json metadata = tagged_metadata("pipit-stage-package", 6);
  metadata["stage"] = "0";
  metadata["stages"] = "1";
  metadata["replica"] = "0";
  metadata["replicas"] = "1";
  metadata["shard_optimizer"] = "false";
  metadata["chunks_per_stage"] = "1";
  metadata["schedule"] = "1f1b";
  metadata["schedule_table"] = "";
  metadata["recompute"] = "none";
  metadata["max_deferred"] = "0";
  metadata["chunk_configs"] = nested(400000);
  metadata["optimizer_config"] = R"({"type": "SGD"})";
  metadata["peers"] = "{}";
  metadata["device"] = "cpu";
  metadata["compute_dtype"] = "F32";
  CHECK_THROWS_WITH(decode_stage_package(encode_safetensors({}, metadata), "deep.pkg"),
                    Catch::Contains("\"chunk_configs\" nests deeper than 64 levels"));
}

TEST_CASE("deeply nested JSON in a checkpoint or a safetensors header is an Error", "[serialize]") {
  json metadata = tagged_metadata("pipit-checkpoint", 1);
  metadata["model_config"] = nested(400000, R"({"type": "Sequential", "layers": )", "}");
  const auto path = std::filesystem::temp_directory_path() / "pipit_test_deep_checkpoint";
  save_safetensors(path.string(), {}, metadata);
  CHECK_THROWS_WITH(load_checkpoint(path.string()),
                    Catch::Contains("\"model_config\" nests deeper than 64 levels"));
  std::filesystem::remove(path);

  const std::string blob = blob_with_header(
      nested(400000, R"({"x": {"dtype": "F32", "shape": )", R"(, "data_offsets": [0, 0]}})"));
  CHECK_THROWS_WITH(decode_safetensors(blob.data(), blob.size(), "deep.safetensors"),
                    Catch::Contains("header nests deeper than 64 levels"));
}
