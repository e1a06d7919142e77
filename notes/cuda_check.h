// CK(call): prints the failing CUDA runtime call and returns 1 from main. Shared by the
// standalone microbenchmarks in notes/.
#pragma once
#include <cstdio>
#include <cuda_runtime.h>

#define CK(x)                                                                   \
    do {                                                                        \
        cudaError_t e = (x);                                                    \
        if (e != cudaSuccess) {                                                 \
            printf("%s: %s\n", #x, cudaGetErrorString(e));                      \
            return 1;                                                           \
        }                                                                       \
    } while (0)
