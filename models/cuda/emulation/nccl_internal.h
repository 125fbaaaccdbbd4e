// What the emulated NCCL's calls (nccl_calls.cc) share with its communicators and groups
// (nccl.cc): one operation of a group, checked at the call and issued to its stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "models/cuda/emulation/include/nccl.h"

namespace freeride::emu {

struct Op {
  enum Kind { kSend, kRecv, kAllReduce, kReduceScatter, kAllGather, kReduce, kBroadcast } kind;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t bytes = 0, count = 0;
  ncclDataType_t type = ncclChar;
  int peer = -1;  // a send's or receive's peer; a reduce's or broadcast's root
  uint64_t collective = 0;
};

size_t TypeBytes(ncclDataType_t type);
// The checks NCCL makes at the call: a live communicator, a peer in range, device memory.
ncclResult_t CheckCall(ncclComm_t comm, cudaStream_t stream, int peer, const void* buffer,
                       size_t bytes);
// Issues `op` now, or at the end of the group it is part of (one stream operation per
// communicator and stream, in call order).
ncclResult_t Issue(ncclComm_t comm, cudaStream_t stream, Op op);
int RanksOf(ncclComm_t comm);
// The next collective's issue number on this rank (collectives match across ranks by it).
uint64_t NextCollective(ncclComm_t comm);

}  // namespace freeride::emu
