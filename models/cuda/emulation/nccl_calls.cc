// The emulated NCCL's calls (models/cuda/emulation/nccl.cc runs them): each checks its
// arguments as NCCL does at the call, then issues one operation to its communicator's group on
// the stream. Collectives take the next issue number, by which the ranks' calls match.
#include <initializer_list>
#include <utility>

#include "models/cuda/emulation/include/nccl.h"
#include "models/cuda/emulation/nccl_internal.h"

using freeride::emu::CheckCall;
using freeride::emu::Issue;
using freeride::emu::NextCollective;
using freeride::emu::Op;
using freeride::emu::RanksOf;
using freeride::emu::TypeBytes;

namespace {

// A buffer the call reads or writes, and its size in bytes.
using Buffer = std::pair<const void*, size_t>;

// Checks each buffer as NCCL does at the call (against the op's peer or root, -1 for none),
// then issues the op; a collective takes the next issue number.
ncclResult_t CheckAndIssue(ncclComm_t comm, cudaStream_t stream, Op op,
                           std::initializer_list<Buffer> buffers) {
  for (const auto& [buffer, bytes] : buffers) {
    if (ncclResult_t r = CheckCall(comm, stream, op.peer, buffer, bytes); r != ncclSuccess) {
      return r;
    }
  }
  if (op.kind != Op::kSend && op.kind != Op::kRecv) op.collective = NextCollective(comm);
  return Issue(comm, stream, op);
}

// The reductions emulated: sums of fp32 or fp64.
bool EmulatedReduction(ncclRedOp_t op, ncclDataType_t type) {
  return op == ncclSum && (type == ncclFloat || type == ncclDouble);
}

}  // namespace

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (peer < 0) return ncclInvalidArgument;
  const size_t bytes = count * TypeBytes(datatype);
  return CheckAndIssue(comm, stream,
                       {.kind = Op::kSend, .send = sendbuff, .bytes = bytes, .peer = peer},
                       {{sendbuff, bytes}});
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (peer < 0) return ncclInvalidArgument;
  const size_t bytes = count * TypeBytes(datatype);
  return CheckAndIssue(comm, stream,
                       {.kind = Op::kRecv, .recv = recvbuff, .bytes = bytes, .peer = peer},
                       {{recvbuff, bytes}});
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op_kind, ncclComm_t comm,
                           cudaStream_t stream) {
  if (!EmulatedReduction(op_kind, datatype)) return ncclInvalidArgument;
  const size_t bytes = count * TypeBytes(datatype);
  return CheckAndIssue(comm, stream,
                       {.kind = Op::kAllReduce,
                        .send = sendbuff,
                        .recv = recvbuff,
                        .bytes = bytes,
                        .count = count,
                        .type = datatype},
                       {{sendbuff, bytes}, {recvbuff, bytes}});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op_kind, ncclComm_t comm,
                               cudaStream_t stream) {
  if (!EmulatedReduction(op_kind, datatype) || comm == nullptr) return ncclInvalidArgument;
  const size_t nranks = static_cast<size_t>(RanksOf(comm));
  const size_t bytes = recvcount * TypeBytes(datatype);
  return CheckAndIssue(comm, stream,
                       {.kind = Op::kReduceScatter,
                        .send = sendbuff,
                        .recv = recvbuff,
                        .bytes = bytes * nranks,
                        .count = recvcount * nranks,
                        .type = datatype},
                       {{sendbuff, bytes * nranks}, {recvbuff, bytes}});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr || TypeBytes(datatype) == 0) return ncclInvalidArgument;
  const size_t nranks = static_cast<size_t>(RanksOf(comm));
  const size_t bytes = sendcount * TypeBytes(datatype);
  return CheckAndIssue(comm, stream,
                       {.kind = Op::kAllGather,
                        .send = sendbuff,
                        .recv = recvbuff,
                        .bytes = bytes,
                        .count = sendcount,
                        .type = datatype},
                       {{sendbuff, bytes}, {recvbuff, bytes * nranks}});
}

// A reduce and a broadcast check sendbuff and recvbuff of the same size each (recvbuff is
// read only where the call writes it, but NCCL checks both) against their root.
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op_kind, int root, ncclComm_t comm, cudaStream_t stream) {
  if (!EmulatedReduction(op_kind, datatype) || root < 0) return ncclInvalidArgument;
  const size_t bytes = count * TypeBytes(datatype);
  return CheckAndIssue(comm, stream,
                       {.kind = Op::kReduce,
                        .send = sendbuff,
                        .recv = recvbuff,
                        .bytes = bytes,
                        .count = count,
                        .type = datatype,
                        .peer = root},
                       {{sendbuff, bytes}, {recvbuff, bytes}});
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (TypeBytes(datatype) == 0 || root < 0) return ncclInvalidArgument;
  const size_t bytes = count * TypeBytes(datatype);
  return CheckAndIssue(comm, stream,
                       {.kind = Op::kBroadcast,
                        .send = sendbuff,
                        .recv = recvbuff,
                        .bytes = bytes,
                        .count = count,
                        .type = datatype,
                        .peer = root},
                       {{sendbuff, bytes}, {recvbuff, bytes}});
}
