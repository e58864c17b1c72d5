/* nccl_abi.h — the few NCCL 2 types, constants and entry points moejit uses, spelled out
 * here because nccl.h is not included (it needs the CUDA runtime's headers, and moejit
 * builds without NCCL). tests/nccl_abi_check.c compiles this header against the real nccl.h
 * wherever one is found: every constant and size below, and each entry point's parameter
 * list (the table is declared a second time with nccl.h's types, and NCCL's functions are
 * assigned to it), must match. Self-contained: no other moejit header. */
#ifndef MJ_NCCL_ABI_H
#define MJ_NCCL_ABI_H

#include <stddef.h>

typedef int mj_nccl_result;            /* ncclResult_t                                       */
typedef int mj_nccl_datatype;          /* ncclDataType_t                                     */
typedef int mj_nccl_redop;             /* ncclRedOp_t                                        */
typedef struct ncclComm *mj_nccl_comm; /* ncclComm_t                                         */
#define MJ_NCCL_UNIQUE_ID_BYTES 128
typedef struct mj_nccl_unique_id {     /* ncclUniqueId                                       */
    char internal[MJ_NCCL_UNIQUE_ID_BYTES];
} mj_nccl_unique_id;

enum {
    MJ_NCCL_SUCCESS = 0,               /* ncclSuccess                                        */
    MJ_NCCL_UNHANDLED_CUDA_ERROR = 1,  /* ncclUnhandledCudaError                             */
    MJ_NCCL_SYSTEM_ERROR = 2,          /* ncclSystemError                                    */
    MJ_NCCL_INTERNAL_ERROR = 3,        /* ncclInternalError                                  */
    MJ_NCCL_INVALID_ARGUMENT = 4,      /* ncclInvalidArgument                                */
    MJ_NCCL_INVALID_USAGE = 5,         /* ncclInvalidUsage                                   */
    MJ_NCCL_REMOTE_ERROR = 6,          /* ncclRemoteError                                    */
    MJ_NCCL_IN_PROGRESS = 7,           /* ncclInProgress: a non-blocking comm's pending call */
    MJ_NCCL_FLOAT32 = 7,               /* ncclFloat32                                        */
    MJ_NCCL_SUM = 0,                   /* ncclSum                                            */
};

/* The table's parameter types: ours by default; tests/nccl_abi_check.c defines them as
 * nccl.h's before including this header. */
#ifndef MJ_NCCL_T_RESULT
#define MJ_NCCL_T_RESULT mj_nccl_result
#define MJ_NCCL_T_DATATYPE mj_nccl_datatype
#define MJ_NCCL_T_REDOP mj_nccl_redop
#define MJ_NCCL_T_COMM mj_nccl_comm
#define MJ_NCCL_T_UNIQUE_ID mj_nccl_unique_id
#define MJ_NCCL_T_STREAM void *
#endif

/* The entry points, resolved by name ("nccl" + the field's name). */
typedef struct mj_nccl_api {
    MJ_NCCL_T_RESULT (*GetVersion)(int *version);
    MJ_NCCL_T_RESULT (*GetUniqueId)(MJ_NCCL_T_UNIQUE_ID *id);
    MJ_NCCL_T_RESULT (*CommInitRank)(MJ_NCCL_T_COMM *comm, int nranks, MJ_NCCL_T_UNIQUE_ID id,
                                     int rank);
    MJ_NCCL_T_RESULT (*CommInitAll)(MJ_NCCL_T_COMM *comms, int ndev, const int *devlist);
    MJ_NCCL_T_RESULT (*AllReduce)(const void *send, void *recv, size_t count,
                                  MJ_NCCL_T_DATATYPE datatype, MJ_NCCL_T_REDOP op,
                                  MJ_NCCL_T_COMM comm, MJ_NCCL_T_STREAM stream);
    MJ_NCCL_T_RESULT (*CommDestroy)(MJ_NCCL_T_COMM comm);
    MJ_NCCL_T_RESULT (*CommCount)(MJ_NCCL_T_COMM comm, int *count);
    MJ_NCCL_T_RESULT (*CommUserRank)(MJ_NCCL_T_COMM comm, int *rank);
    const char *(*GetErrorString)(MJ_NCCL_T_RESULT result);
    /* Optional (NCCL 2.13 and later): NULL when the library has none. */
    const char *(*GetLastError)(MJ_NCCL_T_COMM comm);
} mj_nccl_api;

#endif /* MJ_NCCL_ABI_H */
