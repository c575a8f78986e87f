#pragma once
// A tiny --name value flag parser shared by the programs (samples, tools, bench). Unknown flags,
// missing values, malformed numbers and values outside a flag's choices print one line naming
// the problem and "see --help" and exit with status 2, so the error does not scroll out of view
// behind the usage.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace pipit::support {

class Flags {
 public:
  Flags(std::string program, std::string summary)
      : program_(std::move(program)), summary_(std::move(summary)) {}

  void add(const std::string& name, const std::string& default_value, const std::string& help) {
    order_.push_back(name);
    values_[name] = default_value;
    help_[name] = help;
  }

  // A flag without a value: present means true.
  void add_switch(const std::string& name, const std::string& help) {
    add(name, "false", help);
    switches_.insert(name);
  }

  // A flag the command line must give.
  void add_required(const std::string& name, const std::string& help) {
    add(name, "", help);
    required_.insert(name);
  }

  // A flag that may be given several times; all() returns its values in order.
  void add_repeatable(const std::string& name, const std::string& help) {
    add(name, "", help + " (repeatable)");
    repeatable_.insert(name);
  }

  // An argument that is not a flag, required; they are taken in the order added.
  void add_positional(const std::string& name, const std::string& help) {
    positional_names_.push_back(name);
    help_[name] = help;
  }

  // Adds to a flag's help what this program in particular makes of it (a shared flag's).
  void note(const std::string& name, const std::string& text) { help_.at(name) += "; " + text; }

  void parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") usage(0);
      // A one-letter flag may be given with one dash: -o FILE.
      if (arg.size() == 2 && arg[0] == '-' && values_.count(arg.substr(1))) arg = "-" + arg;
      if (arg.rfind("--", 0) != 0 && positional_values_.size() < positional_names_.size()) {
        positional_values_.push_back(arg);
        continue;
      }
      if (arg.rfind("--", 0) != 0) fail("unexpected argument '" + arg + "'");
      // --name=value is --name value.
      if (const size_t equals = arg.find('='); equals != std::string::npos) {
        const std::string name = arg.substr(2, equals - 2);
        if (!values_.count(name) || switches_.count(name)) fail("unknown flag '--" + name + "'");
        set(name, arg.substr(equals + 1));
        continue;
      }
      const std::string name = arg.substr(2);
      if (!values_.count(name)) fail("unknown flag '" + arg + "'");
      if (switches_.count(name)) {
        set(name, "true");
        continue;
      }
      if (i + 1 >= argc) fail("flag '" + arg + "' needs a value");
      set(name, argv[++i]);
    }
    if (positional_values_.size() < positional_names_.size()) {
      fail("missing " + positional_names_[positional_values_.size()]);
    }
    for (const auto& name : order_) {
      if (required_.count(name) && !given_.count(name)) fail("--" + name + " is required");
    }
  }

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string str(const std::string& name) const { return values_.at(name); }
  bool on(const std::string& name) const { return values_.at(name) == "true"; }
  std::vector<std::string> all(const std::string& name) const {
    const auto it = lists_.find(name);
    return it == lists_.end() ? std::vector<std::string>{} : it->second;
  }
  const std::string& positional(const std::string& name) const {
    const auto it = std::find(positional_names_.begin(), positional_names_.end(), name);
    return positional_values_.at(static_cast<size_t>(it - positional_names_.begin()));
  }

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
    return to_integer(name, values_.at(name), min_value);
  }
  // The flag's comma-separated integers, each >= min_value.
  std::vector<long long> integers(const std::string& name, long long min_value = 1) const {
    std::vector<long long> out;
    for (const std::string& item : items(name)) out.push_back(to_integer(name, item, min_value));
    return out;
  }

  double number(const std::string& name) const { return to_number(name, values_.at(name)); }
  // The flag's comma-separated numbers.
  std::vector<double> numbers(const std::string& name) const {
    std::vector<double> out;
    for (const std::string& item : items(name)) out.push_back(to_number(name, item));
    return out;
  }

  // The flag's value, which must be one of `allowed`.
  std::string choice(const std::string& name, const std::vector<std::string>& allowed) const {
    return to_choice(name, values_.at(name), allowed);
  }
  // The flag's comma-separated values, each one of `allowed`.
  std::vector<std::string> choices(const std::string& name,
                                   const std::vector<std::string>& allowed) const {
    std::vector<std::string> out;
    for (const std::string& item : items(name)) out.push_back(to_choice(name, item, allowed));
    return out;
  }

  // The flags the command line gave, as --name=value arguments (a switch as --name, a repeatable
  // flag once per value), less those named in `except`: what a program passes on to a copy of
  // itself.
  std::vector<std::string> given(const std::set<std::string>& except = {}) const {
    std::vector<std::string> out;
    for (const auto& name : order_) {
      if (!given_.count(name) || except.count(name)) continue;
      if (switches_.count(name)) {
        out.push_back("--" + name);
      } else if (repeatable_.count(name)) {
        for (const auto& value : lists_.at(name)) out.push_back("--" + name + "=" + value);
      } else {
        out.push_back("--" + name + "=" + values_.at(name));
      }
    }
    return out;
  }

  [[noreturn]] void fail(const std::string& message) const {
    std::cerr << program_ << ": " << message << " (see " << program_ << " --help)\n";
    std::exit(2);
  }

  [[noreturn]] void usage(int status) const {
    std::ostream& out = status == 0 ? std::cout : std::cerr;
    out << "usage: " << program_ << (order_.empty() ? "" : " [--flag value ...]");
    for (const auto& name : positional_names_) out << " " << name;
    out << "\n" << summary_ << "\n\n";
    for (const auto& name : positional_names_) out << name << ": " << help_.at(name) << "\n";
    if (!order_.empty()) out << "flags:\n";
    for (const auto& name : order_) {
      const std::string& value = values_.at(name);
      out << "  --" << name << " ("
          << (required_.count(name) ? "required" : "default " + (value.empty() ? "none" : value))
          << ")\n      " << help_.at(name) << "\n";
    }
    std::exit(status);
  }

 private:
  void set(const std::string& name, const std::string& value) {
    given_.insert(name);
    if (repeatable_.count(name)) {
      lists_[name].push_back(value);
    } else {
      values_[name] = value;
    }
  }

  long long to_integer(const std::string& name, const std::string& text,
                       long long min_value) const {
    char* end = nullptr;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0') fail("--" + name + " expects an integer, got '" + text + "'");
    if (value < min_value) {
      fail("--" + name + " must be >= " + std::to_string(min_value) + ", got " + text);
    }
    return value;
  }

  double to_number(const std::string& name, const std::string& text) const {
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0') fail("--" + name + " expects a number, got '" + text + "'");
    return value;
  }

  std::string to_choice(const std::string& name, const std::string& text,
                        const std::vector<std::string>& allowed) const {
    if (std::find(allowed.begin(), allowed.end(), text) != allowed.end()) return text;
    // "a, b or c", leaving out "" (no value) where that is allowed.
    std::vector<std::string> named;
    for (const std::string& value : allowed) {
      if (!value.empty()) named.push_back(value);
    }
    std::string listed;
    for (size_t i = 0; i < named.size(); ++i) {
      listed += (i == 0 ? "" : i + 1 == named.size() ? " or " : ", ") + named[i];
    }
    fail("--" + name + " must be " + listed + ", got '" + text + "'");
  }

  std::string program_, summary_;
  std::vector<std::string> order_, positional_names_, positional_values_;
  std::map<std::string, std::string> values_, help_;
  std::set<std::string> switches_, repeatable_, required_, given_;
  std::map<std::string, std::vector<std::string>> lists_;
};

}  // namespace pipit::support
