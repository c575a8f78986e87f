#pragma once
// Schedules: pure functions from (stages p, microbatches m, chunks per stage v) to the order
// in which each stage runs its tasks. Every schedule runs a stage's backward passes of one
// chunk in increasing microbatch order, so gradients accumulate in the same order as
// sequential gradient accumulation and pipelined training is bit-for-bit equal to it.
#include <string>
#include <vector>

#include "pipeline/schedules/task.h"

namespace pipit {

// All forwards, then all backwards.
Schedule gpipe_schedule(int stages, int microbatches);
// Stage s runs min(p - s - 1, m) warm-up forwards, then alternates one forward and one
// backward, then drains the remaining backwards: at most p - s activations in flight.
Schedule one_f_one_b_schedule(int stages, int microbatches);
// Interleaved 1F1B (Megatron-LM) with v chunks per stage; m must be a multiple of p. Stage s
// runs W warm-up forwards, W = m * v when m == p, else min(2 (p - s - 1) + (v - 1) p, m * v),
// then alternates, then drains, so at most min(W + 1, m * v) activations are in flight. At
// v == 1 it is one_f_one_b_schedule.
Schedule interleaved_schedule(int stages, int microbatches, int chunks_per_stage);
// Forward passes only, microbatch by microbatch (pipelined inference).
Schedule forward_only_schedule(int stages, int microbatches, int chunks_per_stage,
                               Placement placement = Placement::loop);

// Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024), with each
// backward split into I and W (pipeline/schedules/task.h). Built by simulating the stages with unit
// task costs: a free stage runs whichever of its next I, F or W can start first (ties in that
// order), keeping at most `a` microbatches between F and I and at most `d` between I and W. ZB-H1:
// a = p - s (1F1B's activations), d = p; a bubble of (p - 1)(F + I - W), a third of 1F1B's when F =
// I = W. ZB-H2: a = 2 (p - s) - 1, d = 2p; a bubble of (p - 1)(F + I - 2W), or at least (p - 1) F,
// the time the last stage waits for its first input. max_deferred > 0 lowers d to it: less memory
// held by deferred W, a longer bubble.
Schedule zb_h1_schedule(int stages, int microbatches, int max_deferred = 0);
Schedule zb_h2_schedule(int stages, int microbatches, int max_deferred = 0);
// ZB-V: two chunks per stage placed in a V (Placement::v), a = 2p chunk activations per stage
// (1F1B's p stage activations, on every stage), d = p. With F = I = W its bubble is
// (p - 1) F / 2 when m is a multiple of p, below ZB-H1's (p - 1) F and interleaved 1F1B's
// (p - 1)(F + B) / 2.
Schedule zb_v_schedule(int stages, int microbatches, int max_deferred = 0);

// A schedule written by hand: one line per stage, in stage order, listing the stage's tasks in
// the order it runs them; for p = 2, m = 2 (ZB-H1's order):
//   F0 F1 I0 W0 I1 W1
//   F0 I0 F1 I1 W0 W1
// A task is F, B, I or W, then its microbatch, then c<chunk> (needed when v > 1: I3c5). Blank
// lines and '#' comments are skipped. The table is validated (validate_schedule): an Error
// names the first bad token, or the first missing, misplaced or deadlocking task.
Schedule parse_schedule_table(const std::string& table, int stages, int microbatches,
                              int chunks_per_stage);

// By name: "gpipe", "1f1b", "interleaved", "zbh1", "zbh2", "zbv", or "table" (`table`, parsed
// by parse_schedule_table, on the loop placement). Invalid combinations throw an Error naming
// the schedule and the numbers (v > 1 needs "interleaved", "zbv" or a table; "interleaved"
// needs m % p == 0; "zbv" needs v = 2).
// max_deferred (> 0) applies to the zero-bubble schedules only.
Schedule make_schedule(const std::string& name, int stages, int microbatches, int chunks_per_stage,
                       const std::string& table = "", int max_deferred = 0);

// What simulating a schedule shows. The simulation runs every stage's list in order; a task
// starts once its input exists (F(mb, c) after F(mb, c - 1); B(mb, c) after B(mb, c + 1), or
// after F(mb, c) for the last chunk, whose gradient comes from the loss; W(mb, c) after
// I(mb, c)) and its stage is free. Per chunk, forwards cost forward_cost / v, backwards
// backward_cost / v, of which W takes weight_share and I the rest.
struct ScheduleReport {
  std::vector<int> peak_stashed;   // per stage: most forwards awaiting their B or I
  std::vector<int> peak_deferred;  // per stage: most I awaiting their W
  double makespan = 0;             // simulated time of the whole step
};

// Checks that every (microbatch, chunk) has its F and either its B or its I and W exactly
// once, on the chunk's stage (placement loop unless given), in the orders that keep gradients
// bit-for-bit equal to sequential accumulation, and that the simulated run never deadlocks;
// throws an Error describing the first violation.
ScheduleReport validate_schedule(const Schedule& schedule, int stages, int microbatches,
                                 int chunks_per_stage, Placement placement,
                                 double forward_cost = 1.0, double backward_cost = 2.0,
                                 double weight_share = 0.5);
ScheduleReport validate_schedule(const Schedule& schedule, int stages, int microbatches,
                                 int chunks_per_stage, double forward_cost = 1.0,
                                 double backward_cost = 2.0, double weight_share = 0.5);

// The ideal step time with no communication cost: (m + p - 1)(tf + tb) for GPipe and 1F1B,
// (m + (p - 1) / v)(tf + tb) for interleaved 1F1B, m (tf + tb) plus the bubbles above for ZB-H1,
// ZB-H2 and ZB-V (ZB-V's for F = I = W: with other costs its orders, made with unit costs, are
// not claimed optimal), where tf and tb are a whole stage's costs and tw = weight_share tb.
double theoretical_step_time(const std::string& name, int stages, int microbatches,
                             int chunks_per_stage, double forward_cost, double backward_cost,
                             double weight_share = 0.5);

}  // namespace pipit
