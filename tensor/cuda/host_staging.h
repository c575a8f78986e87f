#pragma once
// Copies between pageable host memory and the device through pinned staging buffers. The
// driver can only DMA from page-locked memory; staging chunks ourselves lets a host-to-device
// copy return as soon as the bytes are staged (the device copies while the caller goes on)
// and overlaps the host-side memcpy of one chunk with the transfer of the previous one.
#include <cstddef>

namespace pipit::cuda {

// Queues dst (device) = src (host) on the current stream of the current device. src may be
// reused as soon as this returns.
void copy_host_to_device(void* dst, const void* src, size_t nbytes);
// dst (host) = src (device) after the current stream's queued work; returns when dst holds
// the bytes.
void copy_device_to_host(void* dst, const void* src, size_t nbytes);

}  // namespace pipit::cuda
