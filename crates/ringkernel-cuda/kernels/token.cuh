// token.cuh: CUDA mirror of ringkernel_core::builtin::Token (72 bytes), the message of
// the built-in kernels rk.echo, rk.stage and rk.counter.
#ifndef RK_TOKEN_CUH
#define RK_TOKEN_CUH
#define RK_TOKEN_TYPE_ID 0x524B0001u
struct __align__(8) RkToken {
    rk_u64 id;
    double value;
    rk_u64 stamps[4];
    rk_u32 route[4];
    rk_u32 route_len;
    rk_u32 hops;
};
#endif
