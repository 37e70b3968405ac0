/* Written for this project (from shared/peers/probes/libfabric): stands in for
 * libfabric's configure output when building its MR cache outside libfabric. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
/* Hand-written config.h for building libfabric 1.17.0's MR cache + monitors
 * outside libfabric (Debian bookworm x86_64, gcc 12). */
#define PACKAGE "libfabric"
#define PACKAGE_NAME "libfabric"
#define PACKAGE_VERSION "1.17.0"
#define VERSION "1.17.0"
#define ENABLE_DEBUG 0
#define HAVE_ATOMICS 1
#define HAVE_ATOMICS_LEAST_TYPES 1
#define HAVE_BUILTIN_ATOMICS 1
#define HAVE_BUILTIN_MM_ATOMICS 1
#define PT_LOCK_SPIN 1
#define HAVE_CPUID 1
#define HAVE_SYMVER_SUPPORT 1
#define HAVE_ALIAS_ATTRIBUTE 1
#define HAVE_CLOCK_GETTIME 1
#define HAVE_LIBDL 1
#define HAVE_ELF_H 1
#define HAVE_SYS_AUXV_H 1
#define HAVE_GETIFADDRS 1
#define ENABLE_MEMHOOKS_MONITOR 1
#define ENABLE_UFFD_MONITOR 1
#define HAVE_UFFD_UNMAP 1
#define HAVE___CURBRK 1
#define HAVE_LINUX_MMAN_H 1
#define HAVE_SYS_SYSCALL_H 1
#define HAVE_DECL___SYSCALL 0
#define HAVE_CUDA 0
#define HAVE_ROCR 0
#define HAVE_ZE 0
#define HAVE_NEURON 0
#define HAVE_SYNAPSEAI 0
#define HAVE_GDRCOPY 0
#define HAVE_LTTNG 0
#define HAVE_DMABUF_PEER_MEM 0
#define HAVE_DRM 0
#define HAVE_LIBCUDA 0
#define ENABLE_CUDA_DLOPEN 0
#define ENABLE_ROCR_DLOPEN 0
#define ENABLE_ZE_DLOPEN 0
#define ENABLE_GDRCOPY_DLOPEN 0
#define HAVE_FABRIC_PROFILE 0
#if defined(__linux__) && (defined(__x86_64__) || defined(__amd64__) || defined(__aarch64__)) && ENABLE_MEMHOOKS_MONITOR
#define HAVE_MEMHOOKS_MONITOR 1
#else
#define HAVE_MEMHOOKS_MONITOR 0
#endif
#if HAVE_UFFD_UNMAP && ENABLE_UFFD_MONITOR
#define HAVE_UFFD_MONITOR 1
#else
#define HAVE_UFFD_MONITOR 0
#endif
