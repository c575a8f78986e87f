#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "codec/atomic_file.h"
#include "codec/safetensors.h"
#include "nn/builders.h"
#include "nn/registry.h"
#include "pipit.h"
#include "serialize/model_io.h"

using namespace pipit;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string file_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

void expect_error(const std::string& bytes, const std::string& fragment) {
  INFO("expected an error mentioning: " << fragment);
  CHECK_THROWS_WITH(decode_safetensors(bytes.data(), bytes.size(), "test.safetensors"),
                    Catch::Contains(fragment) && Catch::Contains("test.safetensors"));
}

fs::path temp_dir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("pipit_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("safetensors round trip keeps every dtype's values", "[serialize]") {
  StateDict in;
  in["f32"] = from_vector<float>({1.5f, -2.25f, 3e8f, 0.0f}, {2, 2});
  in["f64"] = from_vector<double>({3.141592653589793, -1e-300});
  in["i32"] = from_vector<int32_t>({-7, 2147483647});
  in["i64"] = from_vector<int64_t>({int64_t(1) << 50, -3});
  in["bool"] = from_vector<bool>({true, false, true});
  in["f16"] = from_vector<float>({1.0f, -0.5f, 65504.0f}).to(DType::f16);
  in["bf16"] = from_vector<float>({1.0f, -3.0f, 1e30f}).to(DType::bf16);
  in["scalar"] = scalar_tensor(2.5);
  in["strided"] = transpose(from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}), 0, 1);
  json meta_out;
  std::string bytes = encode_safetensors(in, {{"step", "12"}, {"note", json{{"a", 1}}}});
  StateDict out = decode_safetensors(bytes.data(), bytes.size(), "memory", &meta_out);
  REQUIRE(out.size() == in.size());
  for (const auto& [name, t] : in) {
    INFO(name);
    CHECK(out[name].shape() == t.shape());
    CHECK(out[name].dtype() == t.dtype());
    CHECK(out[name].to_vector<double>() == t.to_vector<double>());
  }
  CHECK(meta_out["step"] == "12");
  CHECK(json::parse(meta_out["note"].get<std::string>())["a"] == 1);
}

TEST_CASE("a safetensors file from an independent writer loads with its values", "[serialize]") {
  json meta;
  StateDict t = load_safetensors(PIPIT_TEST_DATA "/independent.safetensors", &meta);
  CHECK(meta["writer"] == "make_independent_safetensors.py");
  CHECK(t["weight"].shape() == Shape{2, 3});
  CHECK(t["weight"].to_vector<float>() ==
        std::vector<float>{0.5f, -1.25f, 3.0f, 1e-3f, -7.5f, 42.0f});
  CHECK(t["indices"].to_vector<int64_t>() == std::vector<int64_t>{0, -1, int64_t(1) << 40, 7});
  CHECK(t["scale"].dim() == 0);
  CHECK(t["scale"].item<double>() == 3.141592653589793);
  CHECK(t["half"].dtype() == DType::f16);
  CHECK(t["half"].to_vector<float>() == std::vector<float>{1.0f, -2.5f, 0.099975586f});
  CHECK(t["mask"].to_vector<bool>() == std::vector<bool>{true, false, false, true});
}

TEST_CASE("corrupt safetensors input gives errors naming the field", "[serialize]") {
  const std::string ok_entry = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\1');
  REQUIRE_NOTHROW(decode_safetensors(file_bytes(ok_entry, data).data(), 16 + ok_entry.size(), "x"));
  expect_error(std::string(5, '\0'), "too short");
  std::string huge = file_bytes(ok_entry, data);
  uint64_t bad = 1ull << 40;
  std::memcpy(huge.data(), &bad, 8);
  expect_error(huge, "header length");
  expect_error(file_bytes("{not json", data), "not valid JSON");
  expect_error(file_bytes("[1,2]", ""), "not a JSON object");
  expect_error(file_bytes(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", data), "\"dtype\"");
  expect_error(file_bytes(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", data), "Q7");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data),
               "shape");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data),
               "shape");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", data),
               "outside");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data),
               "outside");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", data),
               "data_offsets");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          data),
               "overlap");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data),
               "unused bytes");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data),
               "belong to none");
  expect_error(
      file_bytes(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                 data),
      "too large");
  expect_error(file_bytes(R"({"__metadata__":{"k":1}})", ""), "__metadata__");
  const std::string flags = R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})";
  REQUIRE(decode_safetensors(file_bytes(flags, std::string("\1\0\1", 3)).data(),
                             8 + flags.size() + 3, "x")
              .at("m")
              .to_vector<float>() == std::vector<float>{1, 0, 1});
  expect_error(file_bytes(flags, std::string("\1\0\xff", 3)),
               "tensor 'm': BOOL element 2 holds the byte 255, not 0 or 1");
}

TEST_CASE("every truncation of a valid file is rejected cleanly", "[serialize]") {
  StateDict in{{"w", from_vector<float>({1, 2, 3})}, {"b", from_vector<int64_t>({4})}};
  std::string bytes = encode_safetensors(in);
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("truncated to " << n << " bytes");
    CHECK_THROWS_AS(decode_safetensors(bytes.data(), n, "cut"), Error);
  }
}

TEST_CASE("files are replaced atomically and missing files are named", "[serialize]") {
  fs::path dir = temp_dir("atomic");
  const std::string path = (dir / "w.safetensors").string();
  save_safetensors(path, {{"w", from_vector<float>({1, 2})}});
  save_safetensors(path, {{"w", from_vector<float>({3, 4})}});
  CHECK(load_safetensors(path)["w"].to_vector<float>() == std::vector<float>{3, 4});
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) files += entry.is_regular_file();
  CHECK(files == 1);  // no temporary left behind
  CHECK_THROWS_WITH(save_safetensors((dir / "missing" / "x.safetensors").string(), {}),
                    Catch::Contains("cannot create"));
  CHECK(load_safetensors(path)["w"].to_vector<float>() == std::vector<float>{3, 4});
  CHECK_THROWS_WITH(load_safetensors((dir / "nope").string()), Catch::Contains("nope"));
  fs::remove_all(dir);
}

TEST_CASE("models round trip through config.json and model.safetensors", "[serialize]") {
  fs::path dir = temp_dir("model");
  Generator generator(3);
  auto model = gpt({11, 8, 2, 2, 16, 0.0}, &generator);
  save_model(*model, dir.string());
  auto restored = load_model(dir.string());
  Tensor tokens = from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1}, {2, 6});
  CHECK(restored->forward(tokens).to_vector<float>() == model->forward(tokens).to_vector<float>());
  CHECK(restored->config() == model->config());

  write_file_atomic((dir / "config.json").string(), "{\"type\": \"Sequential\", \"layers\": [");
  CHECK_THROWS_WITH(load_model(dir.string()), Catch::Contains("config.json"));
  write_file_atomic((dir / "config.json").string(), R"({"type": "Warp", "speed": 9})");
  CHECK_THROWS_WITH(load_model(dir.string()), Catch::Contains("unknown module type 'Warp'"));
  write_file_atomic((dir / "config.json").string(), mlp({3, 4})->config().dump());
  CHECK_THROWS_WITH(load_model(dir.string()), Catch::Contains("model.safetensors"));
  fs::remove(dir / "model.safetensors");
  CHECK_THROWS_WITH(load_model(dir.string()), Catch::Contains("model.safetensors"));
  fs::remove_all(dir);
}

namespace {

// The header's JSON as written (length field and padding removed).
std::string header_json(const OrderedTensors& tensors) {
  const std::string blob = encode_safetensors_header(tensors);
  std::string text = blob.substr(8);
  return text.substr(0, text.find_last_not_of(' ') + 1);
}

std::string library_json(const OrderedTensors& tensors) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", dtype_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  return header.dump();
}

void check_same_layout(const SafetensorsLayout& a, const SafetensorsLayout& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("entry " << i);
    CHECK(a[i].name == b[i].name);
    CHECK(a[i].tensor.dtype() == b[i].tensor.dtype());
    CHECK(a[i].tensor.shape() == b[i].tensor.shape());
    CHECK(a[i].begin == b[i].begin);
    CHECK(a[i].end == b[i].end);
  }
}

}  // namespace

TEST_CASE("plain safetensors headers are the JSON library's, and read the same either way",
          "[serialize]") {
  // Headers without metadata whose names need no escaping are written and read without the
  // library (codec/plain_safetensors_header.h): the bytes and the layout must be its.
  const std::vector<OrderedTensors> cases = {
      {{"0", zeros({2, 3})}},
      {{"0", zeros({2, 3})},
       {"1", from_vector<int64_t>({1, 2, 3})},
       {"2", Tensor::empty({}, DType::f64)},
       {"3", zeros({0, 4})}},
      {{"10", zeros({1})}, {"2", zeros({2})}, {"1", zeros({3})}, {"0", zeros({4})}},
      {{"blocks.0.attn.weight", zeros({4, 4})}, {"a-b/c:d_E", zeros({2})}, {"Z", zeros({1})}},
      {}};
  for (const OrderedTensors& tensors : cases) {
    const std::string plain = header_json(tensors);
    INFO(plain);
    CHECK(plain == library_json(tensors));
    uint64_t data_size = 0;
    for (const auto& [name, t] : tensors) data_size += t.nbytes();
    // The same header spaced out is not plain, so the library reads it.
    const std::string spaced = json::parse(plain).dump(1);
    check_same_layout(plan_safetensors(plain + "   ", data_size, "plain"),
                      plan_safetensors(spaced, data_size, "spaced"));
  }
  // Faults in the plain form are named as in any other.
  const auto expect_plain_error = [](const std::string& header, uint64_t data_size,
                                     const std::string& fragment) {
    INFO("expected an error mentioning: " << fragment << " for " << header);
    CHECK_THROWS_WITH(plan_safetensors(header, data_size, "plain.safetensors"),
                      Catch::Contains(fragment) && Catch::Contains("plain.safetensors"));
  };
  expect_plain_error(R"({"a":{"data_offsets":[0,8],"dtype":"Q7","shape":[2]}})", 8, "Q7");
  expect_plain_error(R"({"a":{"data_offsets":[0,8],"dtype":"F32","shape":[3]}})", 8,
                     "\"shape\" [3] of F32 does not match the 8 bytes");
  expect_plain_error(R"({"a":{"data_offsets":[0,16],"dtype":"F32","shape":[2]}})", 8, "outside");
  expect_plain_error(R"({"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]},)"
                     R"("b":{"data_offsets":[4,8],"dtype":"F32","shape":[1]}})",
                     8, "overlap");
  expect_plain_error(R"({"a":{"data_offsets":[4,8],"dtype":"F32","shape":[1]}})", 8,
                     "unused bytes");
  expect_plain_error(R"({"a":{"data_offsets":[0,4],"dtype":"F32","shape":[1]}})", 8,
                     "belong to none");
  expect_plain_error(R"({"a":{"data_offsets":[0,8],"dtype":"F32","shape":[9223372036854775808]}})",
                     8, "too large");
  // A repeated name is not plain (the library keeps the last); leading zeros are not JSON.
  expect_plain_error(R"({"a":{"data_offsets":[0,4],"dtype":"F32","shape":[1]},)"
                     R"("a":{"data_offsets":[4,8],"dtype":"F32","shape":[1]}})",
                     8, "unused bytes");
  expect_plain_error(R"({"a":{"data_offsets":[0,08],"dtype":"F32","shape":[2]}})", 8,
                     "not valid JSON");
  CHECK_THROWS_WITH(encode_safetensors_header({{"a", zeros({1})}, {"a", zeros({1})}}),
                    Catch::Contains("appears twice"));
  CHECK_THROWS_WITH(encode_safetensors_header({{"__metadata__", zeros({1})}}),
                    Catch::Contains("not a tensor name"));
}
