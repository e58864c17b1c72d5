/* nccl_abi_check.c — runtime/comm/nccl_abi.h against the real nccl.h: compiled (not run) by
 * the test nccl_abi, which CMakeLists.txt adds only where nccl.h and the CUDA runtime's
 * headers are found. Every constant and size moejit spells out must equal NCCL's, and each
 * entry point of moejit's table, declared again with nccl.h's types, must take NCCL's
 * function as it is (-Werror: a parameter of another type or count fails the build).
 * With -DMJ_NCCL_ABI_BREAK one assertion is made false on purpose (the test nccl_abi_break,
 * which must fail to compile: the check has teeth). */
#include <nccl.h>

#define MJ_NCCL_T_RESULT ncclResult_t
#define MJ_NCCL_T_DATATYPE ncclDataType_t
#define MJ_NCCL_T_REDOP ncclRedOp_t
#define MJ_NCCL_T_COMM ncclComm_t
#define MJ_NCCL_T_UNIQUE_ID ncclUniqueId
#define MJ_NCCL_T_STREAM cudaStream_t
#include "comm/nccl_abi.h"

#include "moejit.h"

#define SAME(a, b) _Static_assert((long long)(a) == (long long)(b), #a " must equal " #b)

SAME(MJ_NCCL_SUCCESS, ncclSuccess);
SAME(MJ_NCCL_UNHANDLED_CUDA_ERROR, ncclUnhandledCudaError);
SAME(MJ_NCCL_SYSTEM_ERROR, ncclSystemError);
SAME(MJ_NCCL_INTERNAL_ERROR, ncclInternalError);
SAME(MJ_NCCL_INVALID_ARGUMENT, ncclInvalidArgument);
SAME(MJ_NCCL_INVALID_USAGE, ncclInvalidUsage);
SAME(MJ_NCCL_REMOTE_ERROR, ncclRemoteError);
SAME(MJ_NCCL_IN_PROGRESS, ncclInProgress);
#ifdef MJ_NCCL_ABI_BREAK
SAME(MJ_NCCL_FLOAT32, ncclFloat16);
#else
SAME(MJ_NCCL_FLOAT32, ncclFloat32);
#endif
SAME(MJ_NCCL_SUM, ncclSum);
SAME(MJ_NCCL_UNIQUE_ID_BYTES, NCCL_UNIQUE_ID_BYTES);

/* The types moejit passes in their place: the same size and alignment. */
SAME(sizeof(mj_nccl_result), sizeof(ncclResult_t));
SAME(sizeof(mj_nccl_datatype), sizeof(ncclDataType_t));
SAME(sizeof(mj_nccl_redop), sizeof(ncclRedOp_t));
SAME(sizeof(mj_nccl_comm), sizeof(ncclComm_t));
SAME(sizeof(void *), sizeof(cudaStream_t));
SAME(sizeof(mj_nccl_unique_id), sizeof(ncclUniqueId));
SAME(_Alignof(mj_nccl_unique_id), _Alignof(ncclUniqueId));
SAME(sizeof(mj_comm_id), sizeof(ncclUniqueId)); /* the public id is one, byte for byte */

/* NCCL's functions fit the table as they are. */
void mj_nccl_abi_check(void);
void mj_nccl_abi_check(void) {
    mj_nccl_api a;
    a.GetVersion = ncclGetVersion;
    a.GetUniqueId = ncclGetUniqueId;
    a.CommInitRank = ncclCommInitRank;
    a.CommInitAll = ncclCommInitAll;
    a.AllReduce = ncclAllReduce;
    a.CommDestroy = ncclCommDestroy;
    a.CommCount = ncclCommCount;
    a.CommUserRank = ncclCommUserRank;
    a.GetErrorString = ncclGetErrorString;
    a.GetLastError = ncclGetLastError;
    (void)a;
}
