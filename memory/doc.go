// Package memory allocates, frees and copies memory of any kind HMC supports: host DRAM and the
// memory of accelerators, behind one device-agnostic Memory type.
//
// Host memory (CPU) is page-aligned, mmap'ed and backed by a memfd, so a later transport can
// pass it to another process. NVIDIA memory goes through the CUDA driver API (libcuda.so.1) and
// AMD memory through HIP (libamdhip64.so); both libraries are loaded at run time with purego,
// so the binary builds and runs without any SDK. Where a library or device is missing, New
// returns an error wrapping status.ErrUnsupported that says what was looked for. Cambricon,
// Moore Threads and Huawei Ascend memory are not implemented and always report ErrUnsupported.
//
// Addresses of device memory are Ptr values (a device address is not dereferenceable by Go);
// host buffers also expose their bytes as a slice.
package memory
