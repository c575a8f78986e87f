#pragma once
// The threads that CPU kernels split their loops over. Every thread that runs a parallel loop
// owns a team of helpers (each pipeline stage's thread gets its own, as with OpenMP). A helper
// with no work spins for kHelperSpin; if its last wait was shorter than
// kHelperPollBeforeSleep (it is in a burst of loops), it goes on polling, yielding its core,
// up to kHelperPollBeforeSleep; then it sleeps. Where this process's teams have more threads
// than the machine has cores, helpers and callers sleep at once: the core is wanted by a
// thread with work (libgomp, too, throttles its spin then). OpenMP's default keeps idle
// threads spinning for milliseconds, which on a shared machine takes the cores that other
// stages, workers and ranks need while this process waits for a message.
#include <chrono>
#include <functional>

namespace pipit::cpu {

constexpr auto kHelperSpin = std::chrono::microseconds(50);
constexpr auto kHelperPollBeforeSleep = std::chrono::microseconds(1000);

// Runs body(t, threads) for every t in [0, threads): t = 0 on the calling thread, the rest on
// its helpers; returns when all have. The first exception thrown is rethrown here. Inside a
// body, or in a child process after fork, the loop runs on the calling thread alone
// (body(0, 1)): no nested teams.
void run_on_team(int threads, const std::function<void(int, int)>& body);

}  // namespace pipit::cpu
