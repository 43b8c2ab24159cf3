/* Types of memfabric_hybrid's transfer engine API (smem_trans_def.h). */
#ifndef HMC_SMEM_TRANS_DEF_H
#define HMC_SMEM_TRANS_DEF_H

#include <stdbool.h>
#include <stdint.h>
#include "smem_bm_def.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void *smem_trans_t;

typedef enum {
    SMEM_TRANS_NONE = 0,
    SMEM_TRANS_SENDER,
    SMEM_TRANS_RECEIVER,
    SMEM_TRANS_BOTH,
    SMEM_TRANS_BUTT
} smem_trans_role_t;

typedef struct {
    smem_trans_role_t role;
    uint32_t initTimeout; /* seconds */
    uint32_t deviceId;
    uint32_t flags;
    smem_bm_data_op_type dataOpType; /* host ops; SDMA / DEVICE_RDMA need Ascend hardware */
    bool startConfigServer;
} smem_trans_config_t;

#ifdef __cplusplus
}
#endif
#endif /* HMC_SMEM_TRANS_DEF_H */
