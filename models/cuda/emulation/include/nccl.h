// NCCL as the emulation build sees it (-DFREERIDE_CUDA=EMULATE): the types, constants and
// functions the project calls, with NCCL 2.28's names and numeric values, implemented by
// models/cuda/emulation/nccl.cc between the threads of one process (every rank a thread, all on
// the one emulated device), on the emulated streams, completing in stream order. Only what the
// project uses is declared; a call to anything else fails to compile, which is the point.
#pragma once

#include <climits>
#include <cstddef>

// cuda_runtime.h, not only the API: NCCL's own nccl.h includes it, so its includers get the
// typed cudaMalloc with NCCL on either build.
#include "models/cuda/emulation/include/cuda_runtime.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_VERSION_CODE 22809

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

namespace freeride::emu {
struct NcclComm;
}  // namespace freeride::emu
using ncclComm_t = freeride::emu::NcclComm*;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
} ncclDataType_t;

// Only `blocking` is read: 0 makes ncclCommInitRankConfig return at once (ncclInProgress
// until every rank has joined, which ncclCommGetAsyncError reports), as NCCL's does.
#define NCCL_CONFIG_UNDEF_INT INT_MIN
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER \
  { sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION_CODE, NCCL_CONFIG_UNDEF_INT }

ncclResult_t ncclGetVersion(int* version);
const char* ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id);
// Blocks until all `nranks` ranks have called it with the same id, as NCCL's does.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                    ncclConfig_t* config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
ncclResult_t ncclCommCount(ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
// Sum only (the one operation the project makes), of ncclFloat or ncclDouble, in place or not.
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
// Sum only, of ncclFloat or ncclDouble: rank r gets elements [r·recvcount, (r + 1)·recvcount)
// of the sum of every rank's sendbuff (recvcount × nranks elements); recvbuff may be that
// slice of sendbuff (in place).
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
// recvbuff (sendcount × nranks) gets every rank's sendbuff in rank order; sendbuff may be
// rank r's place in it (in place).
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
// Sum only, of ncclFloat or ncclDouble: the root's recvbuff gets the sum of every rank's
// sendbuff; the others' recvbuff is left as it is. In place when sendbuff == recvbuff.
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
// Every rank's recvbuff gets the root's sendbuff. In place when sendbuff == recvbuff.
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
