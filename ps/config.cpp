#include "ps/config.h"

#include "comm/control.h"
#include "comm/json_fields.h"
#include "tensor/error.h"

namespace pipit {

void validate(const PsConfig& c) {
  PIPIT_CHECK(c.mode == "sync" || c.mode == "async" || c.mode == "bounded",
              "PsConfig.mode must be \"sync\", \"async\" or \"bounded\", got \"", c.mode, "\"");
  PIPIT_CHECK(c.servers >= 1 && c.servers <= 1024, "PsConfig.servers must be in [1, 1024], got ",
              c.servers);
  PIPIT_CHECK(c.workers >= 1 && c.workers <= 1 << 16,
              "PsConfig.workers must be in [1, 65536], got ", c.workers);
  PIPIT_CHECK(c.accumulate >= 1 && c.accumulate <= 1 << 16,
              "PsConfig.accumulate must be in [1, 65536], got ", c.accumulate);
  PIPIT_CHECK(c.max_staleness >= 0, "PsConfig.max_staleness must be >= 0, got ", c.max_staleness);
  PIPIT_CHECK(c.min_workers >= 0 && c.min_workers <= c.workers,
              "PsConfig.min_workers must be in [0, workers = ", c.workers, "], got ",
              c.min_workers);
  PIPIT_CHECK(c.timeout.count() > 0, "PsConfig.timeout must be positive");
}

nlohmann::json to_json(const PsConfig& c) {
  return {{"mode", c.mode},
          {"servers", c.servers},
          {"workers", c.workers},
          {"accumulate", c.accumulate},
          {"max_staleness", c.max_staleness},
          {"min_workers", c.min_workers},
          {"compress", c.compress},
          {"overlap", c.overlap},
          {"optimizer", c.optimizer},
          {"loss", c.loss},
          {"timeout_ms", c.timeout.count()}};
}

PsConfig ps_config_from_json(const nlohmann::json& json, const std::string& what) {
  JsonFields<ControlError> f(json, what);
  PsConfig c;
  c.mode = f.string("mode", 16);
  c.servers = static_cast<int>(f.integer("servers", 1, 1024));
  c.workers = static_cast<int>(f.integer("workers", 1, 1 << 16));
  c.accumulate = static_cast<int>(f.integer("accumulate", 1, 1 << 16));
  c.max_staleness = static_cast<int>(f.integer("max_staleness", 0, 1 << 30));
  c.min_workers = static_cast<int>(f.integer("min_workers", 0, 1 << 16));
  c.compress = f.boolean("compress");
  c.overlap = f.boolean("overlap");
  c.optimizer = f.object("optimizer");
  c.loss = f.object("loss");
  c.timeout = std::chrono::milliseconds(f.integer("timeout_ms", 1, int64_t{1} << 40));
  f.done();
  try {
    validate(c);
  } catch (const Error& e) {
    throw ControlError(what + ": " + e.what());
  }
  return c;
}

}  // namespace pipit
