// The emulated NCCL's calls (models/cuda/emulation/nccl.cc runs them): each checks its
// arguments as NCCL does at the call, then issues one operation to its communicator's group on
// the stream. Collectives take the next issue number, by which the ranks' calls match.
#include "models/cuda/emulation/include/nccl.h"
#include "models/cuda/emulation/nccl_internal.h"

using freeride::emu::CheckCall;
using freeride::emu::Issue;
using freeride::emu::NextCollective;
using freeride::emu::Op;
using freeride::emu::RanksOf;
using freeride::emu::TypeBytes;

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = count * TypeBytes(datatype);
  if (peer < 0) return ncclInvalidArgument;
  if (ncclResult_t r = CheckCall(comm, stream, peer, sendbuff, bytes); r != ncclSuccess) {
    return r;
  }
  Op op{Op::kSend};
  op.send = sendbuff;
  op.bytes = bytes;
  op.peer = peer;
  return Issue(comm, stream, op);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = count * TypeBytes(datatype);
  if (peer < 0) return ncclInvalidArgument;
  if (ncclResult_t r = CheckCall(comm, stream, peer, recvbuff, bytes); r != ncclSuccess) {
    return r;
  }
  Op op{Op::kRecv};
  op.recv = recvbuff;
  op.bytes = bytes;
  op.peer = peer;
  return Issue(comm, stream, op);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op_kind, ncclComm_t comm,
                           cudaStream_t stream) {
  if (op_kind != ncclSum || (datatype != ncclFloat && datatype != ncclDouble)) {
    return ncclInvalidArgument;
  }
  const size_t bytes = count * TypeBytes(datatype);
  for (const void* buffer : {sendbuff, static_cast<const void*>(recvbuff)}) {
    if (ncclResult_t r = CheckCall(comm, stream, -1, buffer, bytes); r != ncclSuccess) {
      return r;
    }
  }
  Op op{Op::kAllReduce};
  op.send = sendbuff;
  op.recv = recvbuff;
  op.bytes = bytes;
  op.count = count;
  op.type = datatype;
  op.collective = NextCollective(comm);
  return Issue(comm, stream, op);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op_kind, ncclComm_t comm,
                               cudaStream_t stream) {
  if (op_kind != ncclSum || (datatype != ncclFloat && datatype != ncclDouble)) {
    return ncclInvalidArgument;
  }
  if (comm == nullptr) return ncclInvalidArgument;
  const size_t nranks = static_cast<size_t>(RanksOf(comm));
  const size_t bytes = recvcount * TypeBytes(datatype);
  for (const auto& [buffer, size] : {std::pair{sendbuff, bytes * nranks}, {recvbuff, bytes}}) {
    if (ncclResult_t r = CheckCall(comm, stream, -1, buffer, size); r != ncclSuccess) {
      return r;
    }
  }
  Op op{Op::kReduceScatter};
  op.send = sendbuff;
  op.recv = recvbuff;
  op.bytes = bytes * nranks;
  op.count = recvcount * nranks;
  op.type = datatype;
  op.collective = NextCollective(comm);
  return Issue(comm, stream, op);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr || TypeBytes(datatype) == 0) return ncclInvalidArgument;
  const size_t nranks = static_cast<size_t>(RanksOf(comm));
  const size_t bytes = sendcount * TypeBytes(datatype);
  for (const auto& [buffer, size] : {std::pair{sendbuff, bytes}, {recvbuff, bytes * nranks}}) {
    if (ncclResult_t r = CheckCall(comm, stream, -1, buffer, size); r != ncclSuccess) {
      return r;
    }
  }
  Op op{Op::kAllGather};
  op.send = sendbuff;
  op.recv = recvbuff;
  op.bytes = bytes;
  op.count = sendcount;
  op.type = datatype;
  op.collective = NextCollective(comm);
  return Issue(comm, stream, op);
}

namespace {

// A reduce's or broadcast's checks: a root in range, and sendbuff and recvbuff of `bytes` each
// (recvbuff is read only where the call writes it, but NCCL checks both).
ncclResult_t CheckRooted(const void* sendbuff, const void* recvbuff, size_t bytes, int root,
                         ncclComm_t comm, cudaStream_t stream) {
  if (root < 0) return ncclInvalidArgument;
  for (const void* buffer : {sendbuff, recvbuff}) {
    if (ncclResult_t r = CheckCall(comm, stream, root, buffer, bytes); r != ncclSuccess) return r;
  }
  return ncclSuccess;
}

}  // namespace

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op_kind, int root, ncclComm_t comm, cudaStream_t stream) {
  if (op_kind != ncclSum || (datatype != ncclFloat && datatype != ncclDouble)) {
    return ncclInvalidArgument;
  }
  const size_t bytes = count * TypeBytes(datatype);
  if (ncclResult_t r = CheckRooted(sendbuff, recvbuff, bytes, root, comm, stream);
      r != ncclSuccess) {
    return r;
  }
  Op op{Op::kReduce};
  op.send = sendbuff;
  op.recv = recvbuff;
  op.bytes = bytes;
  op.count = count;
  op.type = datatype;
  op.peer = root;
  op.collective = NextCollective(comm);
  return Issue(comm, stream, op);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (TypeBytes(datatype) == 0) return ncclInvalidArgument;
  const size_t bytes = count * TypeBytes(datatype);
  if (ncclResult_t r = CheckRooted(sendbuff, recvbuff, bytes, root, comm, stream);
      r != ncclSuccess) {
    return r;
  }
  Op op{Op::kBroadcast};
  op.send = sendbuff;
  op.recv = recvbuff;
  op.bytes = bytes;
  op.count = count;
  op.type = datatype;
  op.peer = root;
  op.collective = NextCollective(comm);
  return Issue(comm, stream, op);
}
