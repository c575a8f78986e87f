#pragma once
// What a chaos session saw: one FaultOutcome per planned fault, a session verdict, and the
// per-kind table that goes into docs/RELIABILITY.md.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "tools/chaos/faults.h"

namespace pipit::chaos {

struct FaultOutcome {
  int index = 0;
  Fault fault;
  bool injected = false;
  std::string detail;            // what exactly happened: the proxy's event, mid-write or not
  bool error_expected = true;    // false: the fault must be absorbed
  bool errored = false;          // the process that should notice reported an error
  std::string error;             // its words (the trainer's error line, or the workers' lines)
  double ms_to_error = -1;       // from the fault to that error
  double budget_ms = 0;          // what the configured timeouts allow
  bool named = false;            // the error names the peer (stage or address) or the file
  int64_t checkpoint_step = -1;  // the latest checkpoint after the fault (-1: none yet)
  bool checkpoint_loads = true;
  std::string versus_reference = "no reference";  // "" = equal bit for bit
  std::vector<std::string> temporaries;           // left behind in the checkpoint directory
  std::vector<std::string> failures;              // broken promises, with evidence
};

struct ChaosReport {
  uint64_t seed = 0;
  std::vector<FaultOutcome> faults;
  std::vector<std::string> notes;     // skipped kinds and why
  std::vector<std::string> failures;  // session-wide: final mismatch, hangs, crashes
  std::string final_versus_reference = "not compared";
  double seconds = 0;

  bool ok() const {
    if (!failures.empty()) return false;
    for (const FaultOutcome& f : faults) {
      if (!f.failures.empty()) return false;
    }
    return true;
  }
  std::vector<std::string> all_failures() const {
    std::vector<std::string> out = failures;
    for (const FaultOutcome& f : faults) {
      for (const std::string& why : f.failures) {
        out.push_back("fault " + std::to_string(f.index) + " (" + f.fault.label() + "): " + why);
      }
    }
    return out;
  }

  // One markdown row per fault label: times injected, errors, time to error, checks.
  std::string table() const {
    struct Row {
      bool expected = true;
      int injected = 0, errored = 0, named = 0, in_time = 0, loads = 0, compared = 0;
      int identical = 0;
      double max_ms = 0;
      std::string example;
    };
    std::map<std::string, Row> rows;
    for (const FaultOutcome& f : faults) {
      if (!f.injected) continue;
      Row& row = rows[f.fault.label()];
      ++row.injected;
      row.expected = f.error_expected;
      if (f.errored) {
        ++row.errored;
        row.max_ms = std::max(row.max_ms, f.ms_to_error);
        if (f.named) ++row.named;
        if (f.ms_to_error <= f.budget_ms) ++row.in_time;
        if (row.example.empty()) row.example = f.error.substr(0, 200);
      }
      if (f.checkpoint_loads) ++row.loads;
      if (f.versus_reference.rfind("no reference", 0) != 0) ++row.compared;
      if (f.versus_reference.empty()) ++row.identical;
    }
    std::string out =
        "| fault | injected | error expected | ended in an error | names peer/file | within "
        "budget | max time to error | checkpoint loads | checkpoint = reference | example "
        "error |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for (const auto& [label, r] : rows) {
      char line[512];
      std::snprintf(line, sizeof line, "| %s | %d | %s | %d | %d | %d | %.0f ms | %d | %d of %d | ",
                    label.c_str(), r.injected, r.expected ? "yes" : "no", r.errored, r.named,
                    r.in_time, r.max_ms, r.loads, r.identical, r.compared);
      std::string example = r.example;
      for (char& c : example) c = c == '|' || c == '`' ? '\'' : c;
      out += line + (example.empty() ? "(none)" : "`" + example + "`") + " |\n";
    }
    return out;
  }
};

}  // namespace pipit::chaos
