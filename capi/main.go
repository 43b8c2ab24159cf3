//go:build cgo

package main

import (
	_ "github.com/hmc-go/hmc/capi/internal/hmcapi"   // hmc_* of sessions, buffers, memory, ctrl, groups
	_ "github.com/hmc-go/hmc/capi/internal/kvapi"    // hmc_kv_* of the KV-cache pool
	_ "github.com/hmc-go/hmc/capi/internal/smemapi"  // memfabric's smem_* (libmf_smem.so)
	_ "github.com/hmc-go/hmc/capi/internal/storeapi" // hmc_store_* of the config store and its groups
	_ "github.com/hmc-go/hmc/capi/internal/transapi" // hmc_trans_* of the transfer engine
)
