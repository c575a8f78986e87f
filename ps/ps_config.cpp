#include "ps/ps_config.h"

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

}  // namespace pipit
