/* HS_HD marks functions compiled for both the host (C) and the device (CUDA), so that one
 * definition of the arithmetic serves both backends. Include from .c and .cu files alike. */
#ifndef HS_CORE_HD_H
#define HS_CORE_HD_H

#ifdef __CUDACC__
#define HS_HD __host__ __device__ __forceinline__
#else
#define HS_HD __attribute__((unused)) inline
#endif

#endif
