#pragma once
// A tiny --name value flag parser shared by the programs (samples, tools, bench). Unknown flags,
// missing values and malformed numbers print one line naming the problem and "see --help" and exit
// with status 2, so the error does not scroll out of view behind the usage.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace samples {

class Flags {
 public:
  Flags(std::string program, std::string summary)
      : program_(std::move(program)), summary_(std::move(summary)) {}

  void add(const std::string& name, const std::string& default_value, const std::string& help) {
    order_.push_back(name);
    values_[name] = default_value;
    help_[name] = help;
  }

  void parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") usage(0);
      if (arg.rfind("--", 0) != 0 && positional_values_.size() < positional_names_.size()) {
        positional_values_.push_back(arg);
        continue;
      }
      if (arg.rfind("--", 0) != 0) fail("unexpected argument '" + arg + "'");
      // --name=value is --name value.
      if (const size_t equals = arg.find('='); equals != std::string::npos) {
        const std::string name = arg.substr(2, equals - 2);
        if (!values_.count(name) || switches_.count(name)) fail("unknown flag '--" + name + "'");
        if (repeatable_.count(name)) {
          lists_[name].push_back(arg.substr(equals + 1));
        } else {
          values_[name] = arg.substr(equals + 1);
        }
        continue;
      }
      if (!values_.count(arg.substr(2))) fail("unknown flag '" + arg + "'");
      if (switches_.count(arg.substr(2))) {
        values_[arg.substr(2)] = "true";
        continue;
      }
      if (i + 1 >= argc) fail("flag '" + arg + "' needs a value");
      if (repeatable_.count(arg.substr(2))) {
        lists_[arg.substr(2)].push_back(argv[++i]);
        continue;
      }
      values_[arg.substr(2)] = argv[++i];
    }
    if (positional_values_.size() < positional_names_.size()) {
      fail("missing " + positional_names_[positional_values_.size()]);
    }
  }

  // An argument that is not a flag, required; they are taken in the order added.
  void add_positional(const std::string& name, const std::string& help) {
    positional_names_.push_back(name);
    help_[name] = help;
  }
  const std::string& positional(const std::string& name) const {
    const auto it = std::find(positional_names_.begin(), positional_names_.end(), name);
    return positional_values_.at(static_cast<size_t>(it - positional_names_.begin()));
  }

  // A flag without a value: present means true.
  void add_switch(const std::string& name, const std::string& help) {
    add(name, "false", help);
    switches_.insert(name);
  }
  bool on(const std::string& name) const { return values_.at(name) == "true"; }

  // A flag that may be given several times; all() returns its values in order.
  void add_repeatable(const std::string& name, const std::string& help) {
    add(name, "", help + " (repeatable)");
    repeatable_.insert(name);
  }
  std::vector<std::string> all(const std::string& name) const {
    const auto it = lists_.find(name);
    return it == lists_.end() ? std::vector<std::string>{} : it->second;
  }

  std::string str(const std::string& name) const { return values_.at(name); }
  // The flag's value split at commas ("a,b" -> {"a", "b"}; "" -> {}).
  std::vector<std::string> items(const std::string& name) const {
    std::vector<std::string> out;
    const std::string& text = values_.at(name);
    for (size_t begin = 0; begin < text.size();) {
      const size_t comma = std::min(text.find(',', begin), text.size());
      out.push_back(text.substr(begin, comma - begin));
      begin = comma + 1;
    }
    return out;
  }

  long long integer(const std::string& name, long long min_value = 1) const {
    const std::string& text = values_.at(name);
    char* end = nullptr;
    long long value = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0') fail("--" + name + " expects an integer, got '" + text + "'");
    if (value < min_value) {
      fail("--" + name + " must be >= " + std::to_string(min_value) + ", got " + text);
    }
    return value;
  }

  double number(const std::string& name) const {
    const std::string& text = values_.at(name);
    char* end = nullptr;
    double value = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0') fail("--" + name + " expects a number, got '" + text + "'");
    return value;
  }

  [[noreturn]] void fail(const std::string& message) const {
    std::cerr << program_ << ": " << message << " (see " << program_ << " --help)\n";
    std::exit(2);
  }

  [[noreturn]] void usage(int status) const {
    std::ostream& out = status == 0 ? std::cout : std::cerr;
    out << "usage: " << program_ << " [--flag value ...]";
    for (const auto& name : positional_names_) out << " " << name;
    out << "\n" << summary_ << "\n\n";
    for (const auto& name : positional_names_) out << name << ": " << help_.at(name) << "\n";
    out << "flags:\n";
    for (const auto& name : order_) {
      out << "  --" << name << " (default "
          << (values_.at(name).empty() ? "none" : values_.at(name)) << ")\n      " << help_.at(name)
          << "\n";
    }
    std::exit(status);
  }

 private:
  std::string program_, summary_;
  std::vector<std::string> order_, positional_names_, positional_values_;
  std::map<std::string, std::string> values_, help_;
  std::set<std::string> switches_, repeatable_;
  std::map<std::string, std::vector<std::string>> lists_;
};

}  // namespace samples
