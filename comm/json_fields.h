#pragma once
// JsonFields: strict reading of one JSON object a peer sent. Each accessor checks that the
// field is present (unless optional), has the right type and lies in range; done() refuses
// every field that was not read. Errors are of type E and name `what` and the field.
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tensor/error.h"

namespace pipit {

template <typename E>
class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string what)
      : object_(object), what_(std::move(what)) {
    if (!object_.is_object()) fail("is ", object_.type_name(), ", not an object");
  }

  bool has(const char* name) const { return object_.contains(name); }

  bool boolean(const char* name) {
    const nlohmann::json& value = field(name);
    if (!value.is_boolean()) fail_field(name, "is not true or false");
    return value.get<bool>();
  }

  int64_t integer(const char* name, int64_t lo, int64_t hi) {
    const nlohmann::json& value = field(name);
    bool fits = false;
    int64_t v = 0;
    if (value.is_number_unsigned()) {
      fits = value.get<uint64_t>() <= static_cast<uint64_t>(hi);
      if (fits) v = static_cast<int64_t>(value.get<uint64_t>());
    } else if (value.is_number_integer()) {
      v = value.get<int64_t>();
      fits = true;
    }
    if (!fits || v < lo || v > hi) {
      fail_field(name, "is ", value.dump(), ", not an integer in [", lo, ", ", hi, "]");
    }
    return v;
  }

  double number(const char* name) {
    const nlohmann::json& value = field(name);
    if (!value.is_number()) fail_field(name, "is ", value.type_name(), ", not a number");
    return value.get<double>();
  }

  std::string string(const char* name, size_t max_length) {
    const nlohmann::json& value = field(name);
    if (!value.is_string()) fail_field(name, "is ", value.type_name(), ", not a string");
    const std::string& text = value.get_ref<const std::string&>();
    if (text.size() > max_length) {
      fail_field(name, "holds ", text.size(), " bytes, more than ", max_length);
    }
    return text;
  }

  // An array of at most max_size elements.
  const nlohmann::json& array(const char* name, size_t max_size) {
    const nlohmann::json& value = field(name);
    if (!value.is_array()) fail_field(name, "is ", value.type_name(), ", not an array");
    if (value.size() > max_size) {
      fail_field(name, "has ", value.size(), " entries, more than ", max_size);
    }
    return value;
  }

  // An array of at most max_size strings, each at most max_length bytes.
  std::vector<std::string> strings(const char* name, size_t max_size, size_t max_length) {
    std::vector<std::string> out;
    for (const nlohmann::json& entry : array(name, max_size)) {
      if (!entry.is_string() || entry.get_ref<const std::string&>().size() > max_length) {
        fail_field(name, "has the entry ", entry.dump(), ", not a string of at most ", max_length,
                   " bytes");
      }
      out.push_back(entry.get<std::string>());
    }
    return out;
  }

  const nlohmann::json& object(const char* name) {
    const nlohmann::json& value = field(name);
    if (!value.is_object()) fail_field(name, "is ", value.type_name(), ", not an object");
    return value;
  }

  // Throws naming the first field nobody read.
  void done() const {
    for (const auto& item : object_.items()) {
      if (!read_.count(item.key())) fail("has the unknown field \"", item.key(), "\"");
    }
  }

  template <typename... Args>
  [[noreturn]] void fail(const Args&... parts) const {
    throw E(detail::concat(what_, " ", parts...));
  }

 private:
  const nlohmann::json& field(const char* name) {
    if (!object_.contains(name)) fail("lacks the field \"", name, "\"");
    read_.insert(name);
    return object_.at(name);
  }

  template <typename... Args>
  [[noreturn]] void fail_field(const char* name, const Args&... parts) const {
    fail("field \"", name, "\" ", parts...);
  }

  const nlohmann::json& object_;
  std::string what_;
  std::set<std::string> read_;
};

}  // namespace pipit
