package memory

import (
	"fmt"
	"strings"

	"github.com/hmc-go/hmc/status"
)

// Type is a kind of memory. The values of DEFAULT through MOORE_GPU equal upstream HMC's
// MemoryType; HuaweiAscendNPU, which upstream dropped from its enum, takes the next free value.
type Type int

// The memory types.
const (
	Default         Type = 0 // the first available accelerator, else CPU
	CPU             Type = 1 // host DRAM (memfd-backed, shareable)
	NvidiaGPU       Type = 2 // CUDA device memory
	AMDGPU          Type = 3 // HIP (ROCm) device memory
	CambriconMLU    Type = 4 // Cambricon MLU (not implemented: ErrUnsupported)
	MooreGPU        Type = 5 // Moore Threads GPU (not implemented: ErrUnsupported)
	HuaweiAscendNPU Type = 6 // Huawei Ascend NPU (not implemented: ErrUnsupported)
)

// Types lists every memory type in value order.
var Types = []Type{Default, CPU, NvidiaGPU, AMDGPU, CambriconMLU, MooreGPU, HuaweiAscendNPU}

var typeNames = [...]string{
	Default:         "DEFAULT",
	CPU:             "CPU",
	NvidiaGPU:       "NVIDIA_GPU",
	AMDGPU:          "AMD_GPU",
	CambriconMLU:    "CAMBRICON_MLU",
	MooreGPU:        "MOORE_GPU",
	HuaweiAscendNPU: "HUAWEI_ASCEND_NPU",
}

// String returns upstream's enum name (CPU, NVIDIA_GPU, ...).
func (t Type) String() string {
	if t >= 0 && int(t) < len(typeNames) {
		return typeNames[t]
	}
	return fmt.Sprintf("Type(%d)", int(t))
}

// IsDevice reports whether t is an accelerator type (anything but CPU and Default).
func (t Type) IsDevice() bool { return t > CPU && int(t) < len(typeNames) }

// ParseType accepts an enum name (case-insensitive) or a short alias: cpu, host, cuda, nvidia,
// gpu, rocm, hip, amd, mlu, moore, musa, npu, ascend, default.
func ParseType(s string) (Type, error) {
	l := strings.ToLower(strings.TrimSpace(s))
	switch l {
	case "default", "":
		return Default, nil
	case "cpu", "host":
		return CPU, nil
	case "cuda", "nvidia", "gpu", "nvidia_gpu":
		return NvidiaGPU, nil
	case "rocm", "hip", "amd", "amd_gpu":
		return AMDGPU, nil
	case "mlu", "cambricon", "cambricon_mlu":
		return CambriconMLU, nil
	case "moore", "musa", "moore_gpu":
		return MooreGPU, nil
	case "npu", "ascend", "huawei_ascend_npu":
		return HuaweiAscendNPU, nil
	}
	return 0, fmt.Errorf("memory type %q: %w", s, status.ErrInvalidConfig)
}
