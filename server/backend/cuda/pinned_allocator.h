// Page-locked host memory (cudaHostAlloc) for the jobs' slots and served bytes on a cuda:N backend
// (HostStagingAbility::HostAllocator): the copies to and from the GPU need no staging.
#pragma once

#include "common/host_buffer.h"

namespace paramd::cuda {

// One per device, for the process's life: a buffer (a lease's, say) may outlive its backend.
BufferAllocator* PinnedAllocatorOf(int device);

}  // namespace paramd::cuda
